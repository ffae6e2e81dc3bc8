//! A search of a model's kind grouped by a field (`denorm search KIND
//! --group-by FIELD`), the same on both backends: the matching documents
//! counted by the field's value, the largest group first, ties in the
//! order of their values. [`group`] counts the matches' documents
//! ([`super::SearchIndex::model_documents`]) here; a backend that can
//! aggregates instead ([`super::SearchIndex::model_groups`]). No I/O.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value as Json;

use crate::domain::{Domain, FieldType, Kind};

/// One value of the grouped field with the documents that hold it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Group {
    /// The value as the document holds it (a keyword's text, a number, a
    /// boolean).
    pub value: Json,
    /// How many matching documents hold it.
    pub count: usize,
    /// Their ids in order, at most the `per_group` asked for.
    pub ids: Vec<String>,
}

/// What a grouped search asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupBy {
    /// The field, checked by [`check`].
    pub field: String,
    /// Its type, as [`check`] returns it.
    pub ty: FieldType,
    /// The most groups, the largest first (0: all).
    pub limit: usize,
    /// The most ids of each group, in id order (0: all).
    pub per_group: usize,
}

/// The field a group-by reads: one `kind` has that holds whole values (a
/// keyword, a ref, a date, a boolean, an integer, a path, a keywords
/// list whose every item is a value), a copy's (`customer.plan`) or a
/// text's exact value (`name.raw`); its type. Analyzed text and floats
/// are refused.
pub fn check(d: &Domain, kind: &Kind, field: &str) -> Result<FieldType, String> {
    // What a filter may name ([`super::filter::searchable`]), but a
    // path's ancestors, which a document does not hold as a value.
    let declared = super::filter::searchable(d, kind).into_iter().find(|(n, _)| n == field && !n.ends_with(".tree"));
    match declared.map(|(_, ty)| ty) {
        None => Err(format!("{} has no field {field:?} to group by", kind.name)),
        Some(FieldType::Text { .. }) => Err(format!("{}.{field} is analyzed text: group by its exact value ({field}.raw, with exact = true in the model)", kind.name)),
        Some(FieldType::Float) => Err(format!("{}.{field} is a float: a group-by reads whole values", kind.name)),
        Some(ty) => Ok(ty),
    }
}

/// The values of `field` (checked by [`check`]) in the document JSON
/// `doc`: none when it is absent, each item of a list once.
fn values(doc: &Json, field: &str) -> Vec<Json> {
    let field = field.strip_suffix(".raw").unwrap_or(field);
    let v = field.split('.').try_fold(doc, |v, part| v.get(part));
    match v {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(items)) => {
            let mut once: Vec<Json> = Vec::with_capacity(items.len());
            items.iter().filter(|i| !i.is_null()).for_each(|i| {
                if !once.contains(i) {
                    once.push(i.clone())
                }
            });
            once
        }
        Some(v) => vec![v.clone()],
    }
}

/// The order of two values of one field, as a terms aggregation orders
/// its keys: numbers by value, `false` before `true`, text by its bytes.
pub fn value_order(a: &Json, b: &Json) -> Ordering {
    match (a, b) {
        (Json::Number(x), Json::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x.cmp(&y),
            _ => x.as_f64().unwrap_or(0.0).total_cmp(&y.as_f64().unwrap_or(0.0)),
        },
        (Json::Bool(x), Json::Bool(y)) => x.cmp(y),
        (Json::String(x), Json::String(y)) => x.cmp(y),
        _ => a.to_string().cmp(&b.to_string()),
    }
}

/// Orders groups as every grouped search answers: the largest first, ties
/// by [`value_order`].
pub fn sort(groups: &mut [Group]) {
    groups.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| value_order(&a.value, &b.value)));
}

/// The groups of `docs` (id, document JSON, in id order) by `by.field`,
/// sorted by [`sort`]: at most `by.limit` groups, each with at most
/// `by.per_group` ids.
pub fn group(docs: &[(String, String)], by: &GroupBy) -> Vec<Group> {
    let mut of: BTreeMap<String, Group> = BTreeMap::new();
    for (id, source) in docs {
        let doc: Json = serde_json::from_str(source).unwrap_or(Json::Null);
        for value in values(&doc, &by.field) {
            let g = of.entry(value.to_string()).or_insert_with(|| Group { value, count: 0, ids: Vec::new() });
            g.count += 1;
            if by.per_group == 0 || g.ids.len() < by.per_group {
                g.ids.push(id.clone());
            }
        }
    }
    let mut out: Vec<Group> = of.into_values().collect();
    sort(&mut out);
    if by.limit > 0 {
        out.truncate(by.limit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn documents_are_counted_by_each_value_of_the_field_the_largest_group_first() {
        let doc = |id: &str, v: Json| (id.to_string(), v.to_string());
        let docs = [
            doc("o1", json!({"status": "open", "customer": {"plan": "gold"}, "tags": ["a", "b"]})),
            doc("o2", json!({"status": "held", "customer": {"plan": "free"}, "tags": ["b"]})),
            doc("o3", json!({"status": "open", "customer": {"plan": "gold"}})),
            doc("o4", json!({"status": "open", "customer": {"plan": "free"}, "tags": []})),
        ];
        let by = |field: &str, limit: usize, per_group: usize| GroupBy { field: field.into(), ty: FieldType::Keyword, limit, per_group };
        let g = group(&docs, &by("status", 0, 2));
        assert_eq!(g.iter().map(|g| (g.value.clone(), g.count, g.ids.clone())).collect::<Vec<_>>(), [(json!("open"), 3, vec!["o1".to_string(), "o3".into()]), (json!("held"), 1, vec!["o2".into()])]);
        let plans: Vec<(Json, usize)> = group(&docs, &by("customer.plan", 0, 0)).into_iter().map(|g| (g.value, g.count)).collect();
        assert_eq!(plans, [(json!("free"), 2), (json!("gold"), 2)], "ties by value");
        let tags: Vec<(Json, usize)> = group(&docs, &by("tags", 0, 0)).into_iter().map(|g| (g.value, g.count)).collect();
        assert_eq!(tags, [(json!("b"), 2), (json!("a"), 1)], "each item of a list, none for an empty or absent one");
        assert_eq!(group(&docs, &by("status", 1, 0)).len(), 1, "at most the limit's groups");
    }

    #[test]
    fn a_document_counts_once_in_a_group_and_ties_are_in_the_order_of_a_terms_aggregation() {
        let doc = |id: &str, v: Json| (id.to_string(), v.to_string());
        let docs = [
            doc("p1", json!({"tags": ["a", "a", "b"], "stock": 10})),
            doc("p2", json!({"tags": ["b"], "stock": 9})),
            doc("p3", json!({"stock": 10, "open": true})),
            doc("p4", json!({"open": false, "stock": 9})),
        ];
        let by = |field: &str| GroupBy { field: field.into(), ty: FieldType::Keyword, limit: 0, per_group: 0 };
        let tags: Vec<(Json, usize, Vec<String>)> = group(&docs, &by("tags")).into_iter().map(|g| (g.value, g.count, g.ids)).collect();
        assert_eq!(tags, [(json!("b"), 2, vec!["p1".to_string(), "p2".into()]), (json!("a"), 1, vec!["p1".into()])]);
        let stock: Vec<Json> = group(&docs, &by("stock")).into_iter().map(|g| g.value).collect();
        assert_eq!(stock, [json!(9), json!(10)], "numbers by value, not by their text");
        let open: Vec<Json> = group(&docs, &by("open")).into_iter().map(|g| g.value).collect();
        assert_eq!(open, [json!(false), json!(true)]);
        assert_eq!(value_order(&json!("B"), &json!("a")), Ordering::Less, "text by its bytes");
    }

    #[test]
    fn a_group_by_reads_a_field_of_whole_values() {
        let d = crate::domain::tests::shop();
        let order = d.kind("order").unwrap();
        for ok in ["status", "customer_id", "placed", "customer.plan", "customer.name.raw"] {
            assert!(check(&d, order, ok).is_ok(), "{ok}");
        }
        assert!(check(&d, order, "customer.name").unwrap_err().contains("customer.name.raw"));
        assert!(check(&d, order, "total").unwrap_err().contains("float"));
        assert!(check(&d, order, "status.raw").unwrap_err().contains("no field"));
        assert!(check(&d, order, "lines").unwrap_err().contains("no field"));
        assert!(check(&d, d.kind("customer").unwrap(), "name").unwrap_err().contains("name.raw"));
    }
}
