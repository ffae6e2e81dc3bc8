//! The settings and mappings denorm needs, and how a found mapping is
//! compared with them (what [`super::setup`] refuses). No I/O.

use serde_json::{json, Value};

use super::names::{alias, write_alias, DELETED_AT_FIELD, DELETED_FIELD, PARTITION_FIELD, POS_FIELD, TENANT_FIELD};
use crate::index::Kind;

/// Index settings: the `path_hierarchy` analyzer behind `path.tree`.
pub fn settings() -> Value {
    json!({
        "analysis": {
            "tokenizer": { "denorm_path_tree": { "type": "path_hierarchy", "delimiter": "/" } },
            "analyzer": { "denorm_path_tree": { "type": "custom", "tokenizer": "denorm_path_tree" } }
        }
    })
}

fn name_with_raw() -> Value {
    json!({ "type": "text", "fields": { "raw": { "type": "keyword" } } })
}

/// The mapping of `kind` (DESIGN.md section 2), strict so that stray fields
/// are refused.
pub fn mapping(kind: Kind) -> Value {
    let props = match kind {
        Kind::Model(k) => super::model::properties_of(k.domain(), k.decl()),
        Kind::File => json!({
            "id": { "type": "keyword" },
            "name": { "type": "keyword" },
            "path": {
                "type": "keyword",
                "fields": { "tree": { "type": "text", "analyzer": "denorm_path_tree", "search_analyzer": "keyword" } }
            },
            "contents": { "type": "text" },
        }),
        Kind::User => json!({
            "id": { "type": "keyword" },
            "name": name_with_raw(),
            "email": { "type": "keyword" },
            "dob": { "type": "date", "format": "yyyy-MM-dd" },
        }),
        Kind::Post => json!({
            "id": { "type": "keyword" },
            "title": { "type": "text" },
            "body": { "type": "text" },
            "user": { "properties": { "id": { "type": "keyword" }, "name": name_with_raw() } },
        }),
    };
    let mut props = props;
    props[POS_FIELD] = json!({ "type": "long" });
    for (field, mapping) in tombstone_fields() {
        props[field] = mapping;
    }
    json!({ "dynamic": "strict", "properties": props })
}

/// The fields added after the first release (tombstones, the writing
/// partition, the tenant), with their mappings: an index that lacks them
/// gets them added.
pub fn tombstone_fields() -> [(&'static str, Value); 4] {
    [
        (DELETED_FIELD, json!({ "type": "boolean" })),
        (DELETED_AT_FIELD, json!({ "type": "date", "format": "epoch_millis" })),
        (PARTITION_FIELD, json!({ "type": "integer" })),
        (TENANT_FIELD, json!({ "type": "keyword" })),
    ]
}

/// Differences between the mapping denorm needs and one found: (field,
/// expected, found). Every parameter denorm sets must be there with the
/// same value (type, analyzers, date format, ...), fields the found
/// mapping lacks count as conflicts, and so do found parameters that
/// change what is indexed (see [`CHANGES_INDEXING`]); `(dynamic)` names
/// the mapping's own `dynamic` setting.
pub fn conflicts(expected: &Value, found: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let dynamic = |m: &Value| m.get("dynamic").map_or("true (the default)".to_string(), |d| d.as_str().map_or(d.to_string(), String::from));
    if expected.get("dynamic").is_some() && dynamic(expected) != dynamic(found) {
        out.push(("(dynamic)".to_string(), dynamic(expected), dynamic(found)));
    }
    out.extend(meta_field_conflicts(found));
    walk("", expected, found, &mut out);
    out
}

/// Metadata fields a template may set that break denorm, which sets none:
/// `_source` disabled or filtered (a document read back would lack
/// fields, and a rewrite would drop them), `_routing` required (every
/// write, which names no routing, would be refused).
fn meta_field_conflicts(found: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let source = &found["_source"];
    if source["enabled"] == json!(false) || source["enabled"] == json!("false") {
        out.push(("(_source)".to_string(), "enabled".to_string(), "disabled".to_string()));
    }
    for filter in ["includes", "excludes"] {
        if source[filter].as_array().is_some_and(|a| !a.is_empty()) {
            out.push(("(_source)".to_string(), format!("no {filter}"), format!("{filter} {}", source[filter])));
        }
    }
    let routing = &found["_routing"]["required"];
    if routing == &json!(true) || routing == &json!("true") {
        out.push(("(_routing)".to_string(), "not required".to_string(), "required".to_string()));
    }
    out
}

/// Field parameters that, found on a field where denorm sets none, change
/// what gets indexed or searched.
pub const CHANGES_INDEXING: &[&str] = &["index", "enabled", "ignore_above", "ignore_malformed", "null_value", "normalizer", "copy_to", "doc_values"];

/// A field's type and the parameters that matter: those `expected` sets
/// and those of [`CHANGES_INDEXING`].
fn describe(field: &Value, expected: &Value) -> String {
    if field.is_null() {
        return "absent".into();
    }
    let ty = field.get("type").and_then(Value::as_str).unwrap_or(if field.get("properties").is_some() { "object" } else { "absent" });
    let mut params: Vec<String> = field
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| !matches!(k.as_str(), "type" | "fields" | "properties"))
        .filter(|(k, _)| expected.get(k.as_str()).is_some() || CHANGES_INDEXING.contains(&k.as_str()))
        .map(|(k, v)| format!("{k} {}", v.as_str().map_or(v.to_string(), String::from)))
        .collect();
    params.sort();
    if params.is_empty() {
        ty.to_string()
    } else {
        format!("{ty} ({})", params.join(", "))
    }
}

fn walk(prefix: &str, expected: &Value, found: &Value, out: &mut Vec<(String, String, String)>) {
    let (Some(exp), found_props) = (expected.get("properties").and_then(Value::as_object), found.get("properties")) else { return };
    for (name, e) in exp {
        let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
        let f = found_props.and_then(|p| p.get(name)).cloned().unwrap_or(Value::Null);
        if describe(e, e) != describe(&f, e) {
            out.push((path.clone(), describe(e, e), describe(&f, e)));
            continue;
        }
        if let Some(subs) = e.get("fields").and_then(Value::as_object) {
            for (sub, se) in subs {
                let sf = f.get("fields").and_then(|x| x.get(sub)).cloned().unwrap_or(Value::Null);
                if describe(se, se) != describe(&sf, se) {
                    out.push((format!("{path}.{sub}"), describe(se, se), describe(&sf, se)));
                }
            }
        }
        walk(&path, e, &f, out);
    }
}

/// Differences between the analysis settings denorm needs (the
/// `denorm_path_tree` tokenizer and analyzer) and an index's settings as
/// `GET /<index>/_settings` returns them (values as strings): (setting,
/// expected, found).
pub fn settings_conflicts(found_index_settings: &Value) -> Vec<(String, String, String)> {
    fn leaves(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(o) => o.iter().for_each(|(k, v)| leaves(&format!("{prefix}.{k}"), v, out)),
            other => out.push((prefix.to_string(), other.as_str().map_or(other.to_string(), String::from))),
        }
    }
    let mut expected = Vec::new();
    leaves("analysis", &settings()["analysis"], &mut expected);
    let mut out: Vec<_> = expected
        .into_iter()
        .filter_map(|(key, want)| {
            let at = key.split('.').fold(found_index_settings, |v, k| &v[k]);
            let got = at.as_str().map_or(if at.is_null() { "absent".to_string() } else { at.to_string() }, String::from);
            (got != want).then(|| (format!("setting index.{key}"), want, got))
        })
        .collect();
    // Parameters denorm does not set change the tokens too (a path
    // tokenizer's `reverse`, `skip`, `replacement`; an analyzer's filters).
    for (section, name) in [("tokenizer", "denorm_path_tree"), ("analyzer", "denorm_path_tree")] {
        let want = &settings()["analysis"][section][name];
        for (param, value) in found_index_settings["analysis"][section][name].as_object().into_iter().flatten() {
            if want.get(param).is_none() {
                let shown = value.as_str().map_or(value.to_string(), String::from);
                out.push((format!("setting index.analysis.{section}.{name}.{param}"), "absent".to_string(), shown));
            }
        }
    }
    out
}

/// The body that creates the meta index: its documents (checkpoints, log
/// bindings, rebuild state) are only read by id, so nothing in them is
/// indexed (`dynamic: false`): no dynamic mapping to guess, say, a parked
/// key as a date, and no dependence on `action.auto_create_index`. Its
/// documents are routed by id over `shards` primaries (review F12).
pub fn meta_index_body(shards: u32) -> Value {
    json!({
        "settings": {"index": {"number_of_shards": shards}},
        "mappings": {"dynamic": false, "properties": {"topic": {"type": "keyword"}}}
    })
}

/// The read alias's definition: it hides tombstones (review of
/// Elasticsearch, F13: Kibana, `_count` and other readers of the alias saw
/// deleted documents as documents without a name or a path for a day).
/// denorm's own searches exclude them as well; GETs by id, which ignore
/// alias filters, and the workers' writes go through the generations' own
/// aliases.
pub fn read_alias() -> Value {
    json!({ "is_write_index": true, "filter": { "bool": { "must_not": [crate::index::elastic::docs::is_deleted()] } } })
}

/// The body that creates generation `g` of `kind`, with its write alias
/// and, for the first generation of a new index, the read alias.
pub fn create_body(prefix: &str, kind: Kind, g: u64, with_read_alias: bool) -> Value {
    let mut aliases = json!({ write_alias(prefix, kind, g): {} });
    if with_read_alias {
        aliases[alias(prefix, kind)] = read_alias();
    }
    json!({ "settings": settings(), "mappings": mapping(kind), "aliases": aliases })
}
