//! The Elasticsearch mapping of a declared model's kinds, and the query of
//! a model's search (docs/model.md, "On Elasticsearch"). A document's
//! `_source` is `command::generic::value::document_json`. No I/O.
//!
//! A kind's fields map by type; a copy is an object of the owner's
//! fields' mappings (`customer.name`); a nested list is `nested`, so that
//! one query matches within one object; a path has its ancestors as
//! `<path>.tree`, as a file's path does. Strict, so that stray fields are
//! refused.

use serde_json::{json, Map, Value as Json};

use crate::domain::{Domain, Field, FieldType, Kind};
use crate::index::filter::Filter;

/// The properties of `kind` of model `d` (`super::mapping::mapping`
/// adds the bookkeeping every document has).
pub fn properties_of(d: &Domain, kind: &Kind) -> Json {
    let mut props = properties(&kind.fields);
    for c in &kind.copies {
        let owner = d.kind(&c.owner).expect("a checked model's copies name kinds");
        let copied: Vec<Field> = c.fields.iter().map(|f| owner.field(f).expect("a checked copy names its owner's fields").clone()).collect();
        props.insert(c.name.clone(), json!({ "properties": properties(&copied) }));
    }
    for n in &kind.nested {
        props.insert(n.name.clone(), json!({ "type": "nested", "properties": properties(&n.fields) }));
    }
    props.insert("id".into(), json!({ "type": "keyword" }));
    Json::Object(props)
}

fn properties(fields: &[Field]) -> Map<String, Json> {
    fields.iter().map(|f| (f.name.clone(), field(&f.ty))).collect()
}

fn field(ty: &FieldType) -> Json {
    match ty {
        FieldType::Keyword | FieldType::Ref { .. } | FieldType::Keywords => json!({ "type": "keyword" }),
        FieldType::Text { analyzer, exact } => {
            // The model's analyzers are Elasticsearch's built-in ones of
            // the same names.
            let mut m = json!({ "type": "text", "analyzer": analyzer.name() });
            if *exact {
                m["fields"] = json!({ "raw": { "type": "keyword" } });
            }
            m
        }
        FieldType::Integer => json!({ "type": "long" }),
        FieldType::Float => json!({ "type": "double" }),
        FieldType::Boolean => json!({ "type": "boolean" }),
        // What a model's dates are (docs/model.md): a date, or a date and
        // a time with seconds.
        FieldType::Date => json!({ "type": "date", "format": "strict_date_optional_time" }),
        FieldType::Path => json!({
            "type": "keyword",
            "fields": { "tree": { "type": "text", "analyzer": "denorm_path_tree", "search_analyzer": "keyword" } }
        }),
    }
}

/// The query of a search of one kind's documents: every filter holds.
pub fn query(filters: &[Filter]) -> Json {
    json!({ "bool": { "filter": filters.iter().map(|f| filter("", f)).collect::<Vec<_>>() } })
}

/// One filter; `within`: the nested list it is inside (`lines.`), or "".
fn filter(within: &str, f: &Filter) -> Json {
    match f {
        Filter::Term { field, value } => json!({ "term": { format!("{within}{field}"): value } }),
        Filter::Match { field, text } => json!({ "match": { format!("{within}{field}"): { "query": text, "operator": "and" } } }),
        Filter::Above { field, gt } => json!({ "range": { format!("{within}{field}"): { "gt": gt } } }),
        Filter::Nested { list, all } => {
            let inner = format!("{within}{list}.");
            json!({ "nested": { "path": format!("{within}{list}"), "query": { "bool": { "filter": all.iter().map(|f| filter(&inner, f)).collect::<Vec<_>>() } } } })
        }
    }
}
