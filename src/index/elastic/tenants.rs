//! A tenant's filtered read aliases on Elasticsearch (see docs/tenants.md):
//! `<prefix>-t-<tenant>-files` (and `-users`, `-posts`) on the current
//! generation's index, filtered to the tenant's documents and routed by
//! the tenant. A tenant's own application searches through them; they are
//! a view, not an access boundary (a GET by id ignores an alias's filter),
//! so its credential needs document-level security. A cutover moves them with
//! the read aliases ([`super::generations::cutover_actions`]);
//! [`super::generations::add_tenant_aliases`] puts them. No I/O.

use serde_json::{json, Value};

use super::names::{kind_name, TENANT_FIELD};
use crate::index::Kind;

pub use super::names::tenant_alias as alias_name;

/// The definition of `tenant`'s alias on `index`: its documents only
/// (tombstones hidden, as the read alias hides them), routed by the tenant
/// (as denorm writes them).
pub fn alias_action(index: &str, name: &str, tenant: &str) -> Value {
    let filter = json!({"bool": {"filter": [{"term": {TENANT_FIELD: tenant}}], "must_not": [super::docs::is_deleted()]}});
    json!({"add": {"index": index, "alias": name, "filter": filter, "routing": tenant}})
}

/// The tenant aliases found on `index` of `kind` (an index's aliases as
/// `GET /<index>/_alias` answers them): the actions that take each off
/// `index` and put it, with its filter and routing, on `to`.
pub fn moved(found: &Value, prefix: &str, kind: Kind, index: &str, to: &str) -> Vec<Value> {
    let own = format!("-{}", kind_name(kind));
    let start = format!("{prefix}{}", super::names::TENANT_MARK);
    let aliases = found[index]["aliases"].as_object().into_iter().flatten();
    aliases
        .filter(|(name, _)| name.starts_with(&start) && name.ends_with(&own))
        .map(|(name, def)| {
            let mut add = json!({"index": to, "alias": name});
            for field in ["filter", "index_routing", "search_routing"] {
                if !def[field].is_null() {
                    add[field] = def[field].clone();
                }
            }
            [json!({"remove": {"index": index, "alias": name}}), json!({"add": add})]
        })
        .collect::<Vec<[Value; 2]>>()
        .concat()
}

/// The tenants with a filtered alias on `index` of files (in `found`, as
/// [`moved`] reads it).
pub fn aliased(found: &Value, prefix: &str, index: &str) -> Vec<String> {
    let start = format!("{prefix}{}", super::names::TENANT_MARK);
    let end = format!("-{}", kind_name(Kind::File));
    let names = found[index]["aliases"].as_object().into_iter().flatten().map(|(name, _)| name);
    names.filter_map(|name| name.strip_prefix(&start)?.strip_suffix(&end).map(String::from)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_aliases_are_named_filtered_and_routed() {
        assert_eq!(alias_name("denorm", "acme", Kind::Post), "denorm-t-acme-posts");
        let a = alias_action("denorm-posts-000001", "denorm-t-acme-posts", "acme");
        assert_eq!(a["add"]["filter"], json!({"bool": {"filter": [{"term": {"tenant": "acme"}}], "must_not": [{"term": {"denorm_deleted": true}}]}}));
        assert_eq!(a["add"]["routing"], "acme");
    }

    #[test]
    fn a_cutover_moves_a_tenants_aliases_with_their_filter_and_routing() {
        let found = json!({"denorm-files-000001": {"aliases": {
            "denorm-files": {},
            "denorm-files-g0": {},
            "denorm-t-acme-files": {"filter": {"term": {"tenant": "acme"}}, "index_routing": "acme", "search_routing": "acme"},
            "other-alias": {}
        }}});
        assert_eq!(aliased(&found, "denorm", "denorm-files-000001"), ["acme"]);
        assert!(aliased(&found, "denorm", "denorm-posts-000001").is_empty());
        let moved = moved(&found, "denorm", Kind::File, "denorm-files-000001", "denorm-files-000002");
        assert_eq!(
            moved,
            vec![
                json!({"remove": {"index": "denorm-files-000001", "alias": "denorm-t-acme-files"}}),
                json!({"add": {"index": "denorm-files-000002", "alias": "denorm-t-acme-files", "filter": {"term": {"tenant": "acme"}}, "index_routing": "acme", "search_routing": "acme"}})
            ]
        );
    }
}
