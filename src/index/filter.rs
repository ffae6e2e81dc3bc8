//! A search of a model's documents as the model declares them, the same on
//! both backends (docs/model.md, "Searches"): every filter of a list must
//! hold. Field names are the model's: `name`, `customer.plan`, `path.tree`,
//! `name.raw` (a text's exact value).

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Filter {
    /// The whole value: a keyword, a ref, a path or one of its ancestors
    /// (`path.tree`), a date as written, a text's exact value
    /// (`<field>.raw`), a keywords item, a boolean as `true` or `false`.
    Term { field: String, value: String },
    /// Analyzed text: every word of `text`, analyzed as the field is.
    Match { field: String, text: String },
    /// An integer or float above `gt`.
    Above { field: String, gt: f64 },
    /// One object of the nested `list` for which every filter holds (its
    /// fields named without the list: `sku`).
    Nested { list: String, all: Vec<Filter> },
}
