//! A search of a model's kind grouped by a field (`denorm search KIND
//! --group-by FIELD`), the same on both backends: the matches' documents
//! ([`super::SearchIndex::model_documents`]) counted by the field's value,
//! the largest group first. No I/O.

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

/// The field a group-by reads: one `kind` has that holds whole values (a
/// keyword, a ref, a date, a boolean, an integer, a path, a keywords
/// list whose every item is a value), a copy's (`customer.plan`) or a
/// text's exact value (`name.raw`). Analyzed text and floats are refused.
pub fn check(d: &Domain, kind: &Kind, field: &str) -> Result<(), String> {
    // What a filter may name ([`super::filter::searchable`]), but a
    // path's ancestors, which a document does not hold as a value.
    let declared = super::filter::searchable(d, kind).into_iter().find(|(n, _)| n == field && !n.ends_with(".tree"));
    match declared.map(|(_, ty)| ty) {
        None => Err(format!("{} has no field {field:?} to group by", kind.name)),
        Some(FieldType::Text { .. }) => Err(format!("{}.{field} is analyzed text: group by its exact value ({field}.raw, with exact = true in the model)", kind.name)),
        Some(FieldType::Float) => Err(format!("{}.{field} is a float: a group-by reads whole values", kind.name)),
        Some(_) => Ok(()),
    }
}

/// The values of `field` (checked by [`check`]) in the document JSON
/// `doc`: none when it is absent, each item of a list.
fn values(doc: &Json, field: &str) -> Vec<Json> {
    let field = field.strip_suffix(".raw").unwrap_or(field);
    let v = field.split('.').try_fold(doc, |v, part| v.get(part));
    match v {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(items)) => items.clone(),
        Some(v) => vec![v.clone()],
    }
}

/// The groups of `docs` (id, document JSON) by `field`: the largest first,
/// ties by value; each with at most `per_group` ids (0: all).
pub fn group(docs: &[(String, String)], field: &str, per_group: usize) -> Vec<Group> {
    let mut by: BTreeMap<String, Group> = BTreeMap::new();
    for (id, source) in docs {
        let doc: Json = serde_json::from_str(source).unwrap_or(Json::Null);
        for value in values(&doc, field) {
            let g = by.entry(value.to_string()).or_insert_with(|| Group { value, count: 0, ids: Vec::new() });
            g.count += 1;
            if per_group == 0 || g.ids.len() < per_group {
                g.ids.push(id.clone());
            }
        }
    }
    let mut out: Vec<Group> = by.into_values().collect();
    out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.value.to_string().cmp(&b.value.to_string())));
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
        let g = group(&docs, "status", 2);
        assert_eq!(g.iter().map(|g| (g.value.clone(), g.count, g.ids.clone())).collect::<Vec<_>>(), [(json!("open"), 3, vec!["o1".to_string(), "o3".into()]), (json!("held"), 1, vec!["o2".into()])]);
        let plans: Vec<(Json, usize)> = group(&docs, "customer.plan", 0).into_iter().map(|g| (g.value, g.count)).collect();
        assert_eq!(plans, [(json!("free"), 2), (json!("gold"), 2)], "ties by value");
        let tags: Vec<(Json, usize)> = group(&docs, "tags", 0).into_iter().map(|g| (g.value, g.count)).collect();
        assert_eq!(tags, [(json!("b"), 2), (json!("a"), 1)], "each item of a list, none for an empty or absent one");
    }

    #[test]
    fn a_group_by_reads_a_field_of_whole_values() {
        let d = crate::domain::tests::shop();
        let order = d.kind("order").unwrap();
        for ok in ["status", "customer_id", "placed", "customer.plan", "customer.name.raw"] {
            assert_eq!(check(&d, order, ok), Ok(()), "{ok}");
        }
        assert!(check(&d, order, "customer.name").unwrap_err().contains("customer.name.raw"));
        assert!(check(&d, order, "total").unwrap_err().contains("float"));
        assert!(check(&d, order, "status.raw").unwrap_err().contains("no field"));
        assert!(check(&d, order, "lines").unwrap_err().contains("no field"));
        assert!(check(&d, d.kind("customer").unwrap(), "name").unwrap_err().contains("name.raw"));
    }
}
