//! A search of a model's documents as the model declares them, the same on
//! both backends (docs/model.md, "Searches"): every filter of a list must
//! hold. Field names are the model's: `name`, `customer.plan`, `path.tree`,
//! `name.raw` (a text's exact value).

use serde::Deserialize;

use crate::domain::{Domain, Field, FieldType, Kind};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Filter {
    /// The whole value: a keyword, a ref, a path or one of its ancestors
    /// (`path.tree`), a date as written, a text's exact value
    /// (`<field>.raw`), a keywords item, a boolean as `true` or `false`,
    /// an integer or a float as its number.
    Term { field: String, value: String },
    /// Analyzed text: every word of `text`, analyzed as the field is.
    Match { field: String, text: String },
    /// An integer or float above `gt`.
    Above { field: String, gt: f64 },
    /// One object of the nested `list` for which every filter holds (its
    /// fields named without the list: `sku`).
    Nested { list: String, all: Vec<Filter> },
}

/// Fields a filter may name, each with its type.
pub(crate) type Named = Vec<(String, FieldType)>;

/// The fields a filter of `scope` may name, each with its type: a kind's
/// own, its copies' (`customer.plan`), a path's ancestors (`path.tree`)
/// and a text's exact value (`name.raw`) as keywords.
pub(crate) fn searchable(d: &Domain, kind: &Kind) -> Named {
    let mut out = Vec::new();
    let mut add = |prefix: &str, f: &Field| {
        let name = format!("{prefix}{}", f.name);
        match &f.ty {
            FieldType::Path => out.push((format!("{name}.tree"), FieldType::Keyword)),
            FieldType::Text { exact: true, .. } => out.push((format!("{name}.raw"), FieldType::Keyword)),
            _ => {}
        }
        out.push((name, f.ty.clone()));
    };
    kind.fields.iter().for_each(|f| add("", f));
    for c in &kind.copies {
        let owner = d.kind(&c.owner);
        c.fields.iter().filter_map(|f| owner.and_then(|o| o.field(f))).for_each(|f| add(&format!("{}.", c.name), f));
    }
    out
}

impl Filter {
    /// Refuses a filter that names what `kind` of model `d` does not have,
    /// or a field of another type than the filter reads: a search answers
    /// the same on both backends, and a misspelt field is an error, not an
    /// empty result.
    pub fn check(&self, d: &Domain, kind: &Kind) -> Result<(), String> {
        self.check_in(&searchable(d, kind), &kind.name, &|list| kind.nested_list(list).map(|n| n.fields.iter().map(|f| (f.name.clone(), f.ty.clone())).collect()))
    }

    fn check_in(&self, fields: &[(String, FieldType)], scope: &str, nested: &dyn Fn(&str) -> Option<Named>) -> Result<(), String> {
        let ty = |field: &str| fields.iter().find(|(n, _)| n == field).map(|(_, t)| t).ok_or_else(|| format!("{scope} has no field {field:?}"));
        match self {
            Filter::Term { field, value } => match ty(field)? {
                FieldType::Boolean if value != "true" && value != "false" => Err(format!("{scope}.{field} is a boolean: a term of it is true or false, not {value:?}")),
                FieldType::Integer if value.parse::<i64>().is_err() => Err(format!("{scope}.{field} is an integer: {value:?} is not one")),
                FieldType::Float if value.parse::<f64>().map_or(true, |v| !v.is_finite()) => Err(format!("{scope}.{field} is a float: {value:?} is not a number")),
                _ => Ok(()),
            },
            Filter::Match { field, .. } => match ty(field)? {
                FieldType::Text { .. } => Ok(()),
                _ => Err(format!("{scope}.{field} is not a text field: a match reads text (a term reads a whole value)")),
            },
            Filter::Above { field, .. } => match ty(field)? {
                FieldType::Integer | FieldType::Float => Ok(()),
                _ => Err(format!("{scope}.{field} is not an integer or float field")),
            },
            Filter::Nested { list, all } => {
                let inner = nested(list).ok_or_else(|| format!("{scope} has no nested list {list:?}"))?;
                all.iter().try_for_each(|f| f.check_in(&inner, &format!("{scope}.{list}"), &|_| None))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_names_the_kinds_fields_with_their_types() {
        let d = crate::domain::tests::shop();
        let (order, product) = (d.kind("order").unwrap(), d.kind("product").unwrap());
        let term = |field: &str| Filter::Term { field: field.into(), value: "x".into() };
        for ok in [term("status"), term("customer.plan"), term("customer.name.raw"), Filter::Above { field: "total".into(), gt: 1.0 }] {
            assert_eq!(ok.check(&d, order), Ok(()), "{ok:?}");
        }
        assert_eq!(term("path.tree").check(&d, product), Ok(()));
        let nested = |all: Vec<Filter>| Filter::Nested { list: "lines".into(), all };
        assert_eq!(nested(vec![term("sku"), Filter::Above { field: "quantity".into(), gt: 2.0 }]).check(&d, order), Ok(()));
        let refused = |f: Filter, kind: &Kind| f.check(&d, kind).unwrap_err();
        assert!(refused(term("status.tree"), order).contains("no field \"status.tree\""));
        assert!(refused(term("sku"), order).contains("order has no field \"sku\""));
        assert!(refused(Filter::Above { field: "status".into(), gt: 1.0 }, order).contains("not an integer or float"));
        assert!(refused(Filter::Match { field: "status".into(), text: "x".into() }, order).contains("not a text field"));
        let valued = |field: &str, value: &str| Filter::Term { field: field.into(), value: value.into() };
        assert_eq!(nested(vec![valued("quantity", "-3"), valued("price", "2.5")]).check(&d, order), Ok(()), "a term of a number");
        assert!(refused(nested(vec![valued("quantity", "2.5")]), order).contains("is an integer"));
        assert!(refused(valued("total", "NaN"), order).contains("is a float"));
        assert!(refused(valued("open", "yes"), d.kind("ticket").unwrap()).contains("true or false"));
        assert!(refused(nested(vec![term("status")]), order).contains("order.lines has no field \"status\""));
        assert!(refused(Filter::Nested { list: "items".into(), all: vec![] }, order).contains("no nested list \"items\""));
    }
}
