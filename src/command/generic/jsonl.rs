//! A model's commands as JSONL, one a line (docs/model.md, "Commands"):
//!
//! ```text
//! {"op":"upsert","kind":"order","id":"o1","fields":{"customer_id":"c1","total":9.5,"lines":[{"sku":"a","quantity":2,"price":4.75}]}}
//! {"op":"patch","kind":"customer","id":"c1","set":{"plan":"gold"}}
//! {"op":"delete","kind":"order","id":"o1","customer_id":"c1"}
//! {"op":"rename_prefix","kind":"product","from":"/garden/tools","to":"/garden/kit"}
//! ```
//!
//! A patch or a delete of a kind keyed by a field names that field's value
//! (`customer_id`, `path`); an owner change is an upsert with
//! `previous_<key field>`. `tenant` is optional on every line.

use serde_json::{Map, Value as Json};

use super::value::{object_from_json, object_to_json, Invalid};
use super::{kind_named, ModelCommand, ModelEnvelope, Op, Value};
use crate::command::jsonl::{parse_lines, LineError};
use crate::domain::Domain;

/// Parses and checks one line against the model. Blank lines yield `None`.
pub fn parse_line(d: &Domain, line_no: usize, line: &str) -> Result<Option<ModelEnvelope>, LineError> {
    if line.trim().is_empty() {
        return Ok(None);
    }
    let err = |reason: String| LineError { line: line_no, reason };
    let fields: Map<String, Json> = serde_json::from_str(line).map_err(|e| err(e.to_string()))?;
    let e = envelope(d, fields).map_err(|e| err(e.to_string()))?;
    e.validate(d).map_err(|e| err(e.to_string()))?;
    Ok(Some(e))
}

/// Parses a whole input; on the first bad line returns its error, so that
/// nothing from a rejected input is produced.
pub fn parse_all(d: &Domain, input: impl std::io::BufRead) -> Result<Vec<ModelEnvelope>, LineError> {
    parse_lines(input, |n, line| parse_line(d, n, line))
}

fn envelope(d: &Domain, mut m: Map<String, Json>) -> Result<ModelEnvelope, Invalid> {
    let tenant = take(&mut m, "tenant")?;
    let op = take(&mut m, "op")?.ok_or_else(|| Invalid::new("op", "is missing: upsert, patch, delete or rename_prefix"))?;
    let kind_name = take(&mut m, "kind")?.ok_or_else(|| Invalid::new("kind", "is missing"))?;
    let kind = kind_named(d, &kind_name)?;
    let id = |m: &mut Map<String, Json>| take(m, "id")?.ok_or_else(|| Invalid::new("id", "is missing"));
    let key_value = |m: &mut Map<String, Json>, prefix: &str| match kind.key_field() {
        None => Ok(None),
        Some(f) => take(m, &format!("{prefix}{f}")),
    };
    let op = match op.as_str() {
        "upsert" => {
            let (id, previous) = (id(&mut m)?, key_value(&mut m, "previous_")?);
            let mut fields = object_from_json("fields", &kind.fields, &kind.nested, &m.remove("fields").unwrap_or_default())?;
            // A nested list left out of a document is empty.
            for n in &kind.nested {
                fields.entry(n.name.clone()).or_insert_with(|| Value::Objects(Vec::new()));
            }
            Op::Upsert { id, previous, fields }
        }
        "patch" => Op::Patch { id: id(&mut m)?, at: key_value(&mut m, "")?, set: object_from_json("set", &kind.fields, &kind.nested, &m.remove("set").unwrap_or_default())? },
        "delete" => Op::Delete { id: id(&mut m)?, at: key_value(&mut m, "")? },
        "rename_prefix" => {
            let from = take(&mut m, "from")?.ok_or_else(|| Invalid::new("from", "is missing"))?;
            Op::RenamePrefix { from, to: take(&mut m, "to")?.ok_or_else(|| Invalid::new("to", "is missing"))? }
        }
        other => return Err(Invalid::new("op", format!("{other:?} is not upsert, patch, delete or rename_prefix"))),
    };
    if let Some(extra) = m.keys().next() {
        return Err(Invalid::new(extra.as_str(), format!("is not a field of {} commands of {}", op.name(), kind.name)));
    }
    Ok(ModelEnvelope::new(ModelCommand { kind: kind_name, op }, tenant))
}

/// Takes a string member out of a line (`None`: absent or null).
fn take(m: &mut Map<String, Json>, name: &str) -> Result<Option<String>, Invalid> {
    match m.remove(name) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s)),
        Some(_) => Err(Invalid::new(name, "is not a string")),
    }
}

/// The JSONL line of a command: what [`parse_line`] reads back as it.
pub fn line(d: &Domain, e: &ModelEnvelope) -> String {
    let kind = d.kind(&e.command.kind).expect("a checked command");
    let mut m = Map::new();
    m.insert("op".into(), e.command.op.name().into());
    m.insert("kind".into(), kind.name.clone().into());
    if let Some(t) = &e.tenant {
        m.insert("tenant".into(), t.clone().into());
    }
    let key_field = kind.key_field();
    match &e.command.op {
        Op::Upsert { id, fields, previous } => {
            m.insert("id".into(), id.clone().into());
            if let (Some(f), Some(p)) = (key_field, previous) {
                m.insert(format!("previous_{f}"), p.clone().into());
            }
            m.insert("fields".into(), object_to_json(fields));
        }
        Op::Patch { id, at, set } => {
            m.insert("id".into(), id.clone().into());
            if let (Some(f), Some(v)) = (key_field, at) {
                m.insert(f.into(), v.clone().into());
            }
            m.insert("set".into(), object_to_json(set));
        }
        Op::Delete { id, at } => {
            m.insert("id".into(), id.clone().into());
            if let (Some(f), Some(v)) = (key_field, at) {
                m.insert(f.into(), v.clone().into());
            }
        }
        Op::RenamePrefix { from, to } => {
            m.insert("from".into(), from.clone().into());
            m.insert("to".into(), to.clone().into());
        }
    }
    Json::Object(m).to_string()
}
