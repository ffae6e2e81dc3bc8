//! The settings a generation is built with while a rebuild writes it, and
//! the live generation's serving settings put back before its cutover.
//!
//! Nothing searches a generation before its cutover, which refreshes it:
//! while it is built it needs no periodic refresh (`refresh_interval:
//! -1`), and no replica, which would index every document a second time
//! (Elasticsearch's advice for bulk loads). Before the cutover the
//! settings the live generation serves with are copied onto it (where the
//! live one has none, the cluster's default) and read back: a generation
//! left without refreshes or replicas is never cut over to.

use std::collections::BTreeMap;

use elasticsearch::indices::{IndicesGetSettingsParts, IndicesPutSettingsParts};
use elasticsearch::Elasticsearch;
use serde_json::{json, Value};

use super::names::concrete;
use super::placement::Placement;
use super::{json_or_status, ElasticError};
use crate::index::Kind;

/// The settings a bulk load changes, as `GET _settings?flat_settings`
/// names them.
pub const SERVING: [&str; 2] = ["index.refresh_interval", "index.number_of_replicas"];

/// Puts generation `g`'s indexes of `kinds` (placed as `placement`: the
/// tenants' own indexes too) on the bulk-load settings. Idempotent.
pub async fn for_loading(client: &Elasticsearch, prefix: &str, g: u64, placement: &Placement, kinds: &[Kind]) -> Result<(), ElasticError> {
    let indexes = placement.all_indexes(prefix, g, kinds);
    put(client, &indexes, json!({"index": {"refresh_interval": "-1", "number_of_replicas": 0}})).await
}

async fn put(client: &Elasticsearch, indexes: &[String], body: Value) -> Result<(), ElasticError> {
    let names: Vec<&str> = indexes.iter().map(String::as_str).collect();
    let r = client.indices().put_settings(IndicesPutSettingsParts::Index(&names)).body(body).send().await?;
    json_or_status(&format!("setting {}", indexes.join(",")), r).await?;
    Ok(())
}

/// Per compiled-in kind, the [`SERVING`] settings generation `g`'s shared
/// index has (a setting absent: the cluster's default).
pub async fn serving(client: &Elasticsearch, prefix: &str, g: u64) -> Result<Vec<BTreeMap<String, String>>, ElasticError> {
    let mut out = Vec::new();
    for kind in super::names::KINDS {
        out.push(serving_of(client, &concrete(prefix, kind, g)).await?);
    }
    Ok(out)
}

/// The [`SERVING`] settings `index` has.
async fn serving_of(client: &Elasticsearch, index: &str) -> Result<BTreeMap<String, String>, ElasticError> {
    let r = client.indices().get_settings(IndicesGetSettingsParts::IndexName(&[index], &SERVING)).flat_settings(true).send().await?;
    let v = json_or_status(&format!("reading the settings of {index}"), r).await?;
    Ok(of(&v, index))
}

/// The [`SERVING`] settings of `index` in a `GET _settings` answer
/// (noida-db answers `{}` when none is set, Elasticsearch an empty map).
fn of(answer: &Value, index: &str) -> BTreeMap<String, String> {
    let set = answer[index]["settings"].as_object().cloned().unwrap_or_default();
    set.into_iter().filter(|(k, _)| SERVING.contains(&k.as_str())).map(|(k, v)| (k, v.as_str().map_or_else(|| v.to_string(), String::from))).collect()
}

/// Copies generation `from`'s [`SERVING`] settings (its shared indexes')
/// onto every index of generation `to` (placed as `placement`) of `kinds`
/// and reads them back: an error names what did not take. A kind `from`
/// does not have (a model's new kind) gets the settings of `from`'s files.
pub async fn restore(client: &Elasticsearch, prefix: &str, (from, to): (u64, u64), placement: &Placement, kinds: &super::generations::CutoverKinds<'_>) -> Result<(), ElasticError> {
    let mut want = Vec::new();
    for &kind in kinds.to {
        let template = kinds.from.iter().copied().find(|k| super::names::kind_name(*k) == super::names::kind_name(kind)).unwrap_or(Kind::File);
        want.push(serving_of(client, &concrete(prefix, template, from)).await?);
    }
    for (kind, settings) in kinds.to.iter().zip(&want) {
        let body: serde_json::Map<String, Value> = SERVING.iter().map(|s| (s.to_string(), settings.get(*s).map_or(Value::Null, |v| json!(v)))).collect();
        put(client, &placement.indexes(prefix, *kind, to), Value::Object(body)).await?;
    }
    for (kind, want) in kinds.to.iter().zip(&want) {
        for index in placement.indexes(prefix, *kind, to) {
            let got = serving_of(client, &index).await?;
            if want != &got {
                return Err(ElasticError::Config(format!(
                    "{index} kept the settings {got:?} after the live generation's {want:?} were put back: it is not cut over to (it would serve without its refreshes or replicas)"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serving_settings_are_read_from_either_answer() {
        let es = json!({"denorm-files-000002": {"settings": {"index.refresh_interval": "-1", "index.number_of_replicas": "0", "index.uuid": "x"}}});
        let got = of(&es, "denorm-files-000002");
        assert_eq!(got, [("index.number_of_replicas".to_string(), "0".to_string()), ("index.refresh_interval".to_string(), "-1".to_string())].into_iter().collect());
        assert!(of(&json!({}), "denorm-files-000002").is_empty(), "noida-db: none set");
        assert!(of(&json!({"denorm-files-000002": {"settings": {}}}), "denorm-files-000002").is_empty());
    }
}
