//! A grouped search of a model's kind on Elasticsearch
//! (`denorm search KIND --group-by FIELD`): a `terms` aggregation on the
//! field, ordered as [`crate::index::group::sort`] orders groups, with each
//! group's first ids by `top_hits`. The counts are the server's, so the
//! matching documents are never read by denorm. No I/O.
//!
//! What it does not answer is counted from every match instead
//! ([`crate::index::SearchIndex::model_groups`]'s default): a date's groups
//! (a terms aggregation keys a date by its instant, not by the text the
//! document holds), every id of a group or more than
//! `index.max_inner_result_window` of them, and more groups than one
//! aggregation returns.

use serde_json::{json, Value};

use crate::domain::FieldType;
use crate::index::group::{Group, GroupBy};

/// Elasticsearch's default `index.max_inner_result_window`: the most
/// `top_hits` per bucket.
pub const MAX_INNER_RESULT_WINDOW: usize = 100;

/// The most groups one aggregation is asked for (Elasticsearch's
/// `search.max_buckets` is 65,536).
pub const MAX_GROUPS: usize = 10_000;

/// How many groups to ask the aggregation for, if it answers `by`.
pub fn size(by: &GroupBy) -> Option<usize> {
    let ids = (1..=MAX_INNER_RESULT_WINDOW).contains(&by.per_group);
    let groups = by.limit <= MAX_GROUPS;
    (ids && groups && by.ty != FieldType::Date).then_some(if by.limit == 0 { MAX_GROUPS } else { by.limit })
}

/// The request: no hits, the groups of `query`'s matches.
pub fn body(query: Value, by: &GroupBy, size: usize) -> Value {
    json!({
        "size": 0,
        "query": query,
        "aggs": {
            "groups": {
                "terms": {"field": by.field, "size": size, "order": [{"_count": "desc"}, {"_key": "asc"}]},
                "aggs": {"top": {"top_hits": {"size": by.per_group, "sort": [{"id": "asc"}], "_source": ["id"]}}}
            }
        }
    })
}

/// The groups of a response to [`body`], or `None` when it left groups
/// out that `by` asks for (more than [`MAX_GROUPS`] of them with every
/// group asked for).
pub fn parse(v: &Value, by: &GroupBy) -> Option<Vec<Group>> {
    let agg = &v["aggregations"]["groups"];
    let buckets = agg["buckets"].as_array().map(Vec::as_slice).unwrap_or_default();
    if by.limit == 0 && agg["sum_other_doc_count"].as_u64().unwrap_or(0) > 0 {
        return None;
    }
    let mut groups: Vec<Group> = buckets
        .iter()
        .map(|b| Group {
            value: value(&by.ty, b),
            count: b["doc_count"].as_u64().unwrap_or(0) as usize,
            ids: b["top"]["hits"]["hits"].as_array().into_iter().flatten().filter_map(|h| h["_source"]["id"].as_str().map(str::to_string)).collect(),
        })
        .collect();
    // The order the aggregation was asked for, whichever way the server
    // compares its keys (a boolean's are 0 and 1).
    crate::index::group::sort(&mut groups);
    Some(groups)
}

/// A bucket's value as the documents hold it: Elasticsearch keys a boolean
/// by 0 or 1 with `key_as_string` "false" or "true".
fn value(ty: &FieldType, bucket: &Value) -> Value {
    let key = &bucket["key"];
    match ty {
        FieldType::Boolean => match (bucket["key_as_string"].as_str(), key) {
            (Some(s), _) => Value::Bool(s == "true"),
            (None, Value::Number(n)) => Value::Bool(n.as_i64() == Some(1)),
            (None, k) => k.clone(),
        },
        _ => key.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by(field: &str, ty: FieldType, limit: usize, per_group: usize) -> GroupBy {
        GroupBy { field: field.into(), ty, limit, per_group }
    }

    #[test]
    fn the_aggregation_answers_a_limit_of_groups_with_their_first_ids_but_not_dates_or_every_id() {
        assert_eq!(size(&by("status", FieldType::Keyword, 5, 3)), Some(5));
        assert_eq!(size(&by("status", FieldType::Keyword, 0, 100)), Some(MAX_GROUPS), "every group: as many as one aggregation returns");
        assert_eq!(size(&by("status", FieldType::Keyword, MAX_GROUPS + 1, 3)), None);
        assert_eq!(size(&by("status", FieldType::Keyword, 5, 0)), None, "every id of a group");
        assert_eq!(size(&by("status", FieldType::Keyword, 5, 101)), None);
        assert_eq!(size(&by("placed", FieldType::Date, 5, 3)), None);
        let b = body(json!({"match_all": {}}), &by("customer.plan", FieldType::Keyword, 5, 3), 5);
        let terms = &b["aggs"]["groups"]["terms"];
        assert_eq!((&terms["field"], &terms["size"], &terms["order"]), (&json!("customer.plan"), &json!(5), &json!([{"_count": "desc"}, {"_key": "asc"}])));
        assert_eq!(b["aggs"]["groups"]["aggs"]["top"]["top_hits"]["size"], 3);
        assert_eq!(b["size"], 0, "no hits: only the groups");
    }

    #[test]
    fn buckets_become_groups_in_the_order_of_every_grouped_search() {
        let bucket = |key: Value, as_string: Option<&str>, n: u64, ids: &[&str]| {
            let mut b = json!({"key": key, "doc_count": n, "top": {"hits": {"hits": ids.iter().map(|i| json!({"_source": {"id": i}})).collect::<Vec<_>>()}}});
            if let Some(s) = as_string {
                b["key_as_string"] = s.into();
            }
            b
        };
        let response = |buckets: Vec<Value>, other: u64| json!({"aggregations": {"groups": {"buckets": buckets, "sum_other_doc_count": other}}});
        // Elasticsearch's boolean keys; noida-db's are booleans.
        for (t, f) in
            [(bucket(json!(1), Some("true"), 2, &["t1", "t2"]), bucket(json!(0), Some("false"), 2, &["t3"])), (bucket(json!(true), None, 2, &["t1", "t2"]), bucket(json!(false), None, 2, &["t3"]))]
        {
            let g = parse(&response(vec![t, f], 0), &by("open", FieldType::Boolean, 0, 2)).unwrap();
            assert_eq!(g.iter().map(|g| (g.value.clone(), g.count, g.ids.clone())).collect::<Vec<_>>(), [(json!(false), 2, vec!["t3".to_string()]), (json!(true), 2, vec!["t1".into(), "t2".into()])]);
        }
        let g = parse(&response(vec![bucket(json!(10), None, 3, &[]), bucket(json!(9), None, 3, &[])], 7), &by("stock", FieldType::Integer, 2, 1)).unwrap();
        assert_eq!(g.iter().map(|g| g.value.clone()).collect::<Vec<_>>(), [json!(9), json!(10)], "a tie by value");
        assert_eq!(parse(&response(vec![bucket(json!("a"), None, 1, &[])], 7), &by("status", FieldType::Keyword, 0, 1)), None, "groups left out of every group asked for");
    }
}
