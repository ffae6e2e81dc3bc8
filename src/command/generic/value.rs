//! The values of a model's fields, typed by the model: read from JSON (a
//! JSONL line) or built by the Avro decoder, and checked against the
//! field's type either way, since both come from producers.

use std::collections::BTreeMap;

use serde_json::Value as Json;

use crate::command::{date_problem, id_problem, path, CommandError, MAX_TERM_LEN};
use crate::domain::{Domain, Field, FieldType, Kind, Nested};

/// Most items in one keyword list, or objects in one nested list: each is
/// indexed, so a list multiplies what one document writes.
pub const MAX_LIST: usize = 1024;

/// A field's value. Which variant a field holds follows from its type:
/// strings for keyword, text, date, path and ref fields.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    /// A `keywords` field.
    List(Vec<String>),
    /// A nested list of objects.
    Objects(Vec<Object>),
}

/// Fields by name: a document's, a patch's, or a nested object's.
pub type Object = BTreeMap<String, Value>;

/// What is wrong with a field of a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {reason}")]
pub struct Invalid {
    /// Dotted: `fields.customer_id`, `set.lines[2].sku`.
    pub field: String,
    pub reason: String,
}

impl Invalid {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Invalid { field: field.into(), reason: reason.into() }
    }
}

/// Checks a document id, or a ref field's.
pub fn check_id(field: &str, id: &str) -> Result<(), Invalid> {
    id_problem(id).map_or(Ok(()), |r| Err(Invalid::new(field, r)))
}

/// Checks a path as a producer writes it (absolute, no empty or dot
/// segments, at most [`path::MAX_DEPTH`] deep).
pub fn check_path(field: &str, p: &str) -> Result<(), Invalid> {
    path::validate("path", p).map_err(|e| match e {
        CommandError::InvalidPath { path, reason, .. } => Invalid::new(field, format!("{path:?} {reason}")),
        other => Invalid::new(field, other.to_string()),
    })
}

/// Checks a value against the field declaring it. `at` names the field.
pub fn check(at: &str, f: &Field, v: &Value) -> Result<(), Invalid> {
    let wrong = || Err(Invalid::new(at, format!("is not a{} {} value", if f.ty.name().starts_with(['a', 'e', 'i', 'o', 'u']) { "n" } else { "" }, f.ty.name())));
    match (&f.ty, v) {
        (FieldType::Keyword, Value::Str(s)) => check_term(at, s),
        (FieldType::Ref { .. }, Value::Str(s)) => check_id(at, s),
        // An exact value is also indexed as one term.
        (FieldType::Text { exact: true, .. }, Value::Str(s)) => check_term(at, s),
        (FieldType::Text { exact: false, .. }, Value::Str(_)) => Ok(()),
        (FieldType::Date, Value::Str(s)) => check_date(at, s),
        (FieldType::Path, Value::Str(s)) => check_path(at, s),
        (FieldType::Integer, Value::Int(_)) | (FieldType::Boolean, Value::Bool(_)) => Ok(()),
        (FieldType::Float, Value::Float(x)) if x.is_finite() => Ok(()),
        (FieldType::Float, Value::Float(_)) => Err(Invalid::new(at, "is not a finite number")),
        (FieldType::Keywords, Value::List(items)) => {
            if items.len() > MAX_LIST {
                return Err(Invalid::new(at, format!("has {} items, more than {MAX_LIST}", items.len())));
            }
            items.iter().enumerate().try_for_each(|(i, s)| check_term(&format!("{at}[{i}]"), s))
        }
        _ => wrong(),
    }
}

/// Checks a nested list's objects against the list's fields: each object
/// has every required field, no undeclared one, and values of their types.
pub fn check_objects(at: &str, fields: &[Field], v: &Value) -> Result<(), Invalid> {
    let Value::Objects(objects) = v else { return Err(Invalid::new(at, "is not a list of objects")) };
    if objects.len() > MAX_LIST {
        return Err(Invalid::new(at, format!("has {} objects, more than {MAX_LIST}", objects.len())));
    }
    for (i, o) in objects.iter().enumerate() {
        check_object(&format!("{at}[{i}]"), fields, &[], o, true)?;
    }
    Ok(())
}

/// Checks an object's members against `fields` and the nested `lists`
/// (none inside a nested object); `whole`: every required field must be
/// there (an upsert's document, a nested object), otherwise any may be
/// left out (a patch).
pub fn check_object(at: &str, fields: &[Field], lists: &[Nested], o: &Object, whole: bool) -> Result<(), Invalid> {
    for (name, v) in o {
        let here = || format!("{at}.{name}");
        if let Some(list) = lists.iter().find(|l| &l.name == name) {
            check_objects(&here(), &list.fields, v)?;
        } else {
            let f = fields.iter().find(|f| &f.name == name).ok_or_else(|| Invalid::new(here(), "is not a field of the kind"))?;
            check(&here(), f, v)?;
        }
    }
    if whole {
        if let Some(f) = fields.iter().find(|f| !f.optional && !o.contains_key(&f.name)) {
            return Err(Invalid::new(format!("{at}.{}", f.name), "is required"));
        }
    }
    Ok(())
}

fn check_term(at: &str, s: &str) -> Result<(), Invalid> {
    if s.len() > MAX_TERM_LEN {
        return Err(Invalid::new(at, format!("is {} bytes, longer than {MAX_TERM_LEN}", s.len())));
    }
    Ok(())
}

/// A date (`YYYY-MM-DD`) or a date and time
/// (`YYYY-MM-DDTHH:MM:SS`, an optional fraction of up to 9 digits, an
/// optional `Z` or `±HH:MM`): what Elasticsearch's
/// `strict_date_optional_time` takes with seconds.
pub fn check_date(at: &str, s: &str) -> Result<(), Invalid> {
    let bad = |why: &str| Err(Invalid::new(at, format!("{s:?} {why}")));
    if s.len() < 10 || !s.is_char_boundary(10) {
        return bad("is not a YYYY-MM-DD date");
    }
    let (date, rest) = s.split_at(10);
    if let Some(why) = date_problem(date) {
        return bad(why);
    }
    if rest.is_empty() {
        return Ok(());
    }
    let time_problem = time_problem(rest);
    time_problem.map_or(Ok(()), bad)
}

/// What keeps `t` from being `THH:MM:SS[.fraction][Z|±HH:MM]`.
fn time_problem(t: &str) -> Option<&'static str> {
    let b = t.as_bytes();
    let two = |i: usize, max: u32| b.len() >= i + 2 && b[i].is_ascii_digit() && b[i + 1].is_ascii_digit() && u32::from(b[i] - b'0') * 10 + u32::from(b[i + 1] - b'0') <= max;
    let shaped = b.len() >= 9 && b[0] == b'T' && two(1, 23) && b[3] == b':' && two(4, 59) && b[6] == b':' && two(7, 59);
    if !shaped {
        return Some("has no THH:MM:SS time after its date");
    }
    let mut i = 9;
    if b.get(i) == Some(&b'.') {
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || digits > 9 {
            return Some("has a fraction of a second of other than 1 to 9 digits");
        }
        i += 1 + digits;
    }
    match &b[i..] {
        [] | [b'Z'] => None,
        [b'+' | b'-', ..] if b.len() == i + 6 && two(i + 1, 23) && b[i + 3] == b':' && two(i + 4, 59) => None,
        _ => Some("has a time zone other than Z or ±HH:MM"),
    }
}

/// Reads a JSON value as the field's type: what a JSONL line holds. An
/// integer is taken for a float field; nothing else is converted.
pub fn from_json(at: &str, f: &Field, j: &Json) -> Result<Value, Invalid> {
    let v = match (&f.ty, j) {
        (FieldType::Integer, Json::Number(n)) => Value::Int(n.as_i64().ok_or_else(|| Invalid::new(at, "is not a 64-bit integer"))?),
        (FieldType::Float, Json::Number(n)) => Value::Float(n.as_f64().ok_or_else(|| Invalid::new(at, "is not a number"))?),
        (FieldType::Boolean, Json::Bool(b)) => Value::Bool(*b),
        (FieldType::Keywords, Json::Array(items)) => {
            Value::List(items.iter().enumerate().map(|(i, s)| s.as_str().map(str::to_string).ok_or_else(|| Invalid::new(format!("{at}[{i}]"), "is not a string"))).collect::<Result<_, _>>()?)
        }
        (FieldType::Keyword | FieldType::Ref { .. } | FieldType::Text { .. } | FieldType::Date | FieldType::Path, Json::String(s)) => Value::Str(s.clone()),
        _ => return Err(Invalid::new(at, format!("is not a JSON value of a {} field", f.ty.name()))),
    };
    check(at, f, &v)?;
    Ok(v)
}

/// Reads a JSON object's members as `fields` and the nested `lists`
/// declare them.
pub fn object_from_json(at: &str, fields: &[Field], lists: &[Nested], j: &Json) -> Result<Object, Invalid> {
    let Json::Object(m) = j else { return Err(Invalid::new(at, "is missing or not an object")) };
    m.iter().map(|(name, v)| Ok((name.clone(), member_from_json(at, fields, lists, name, v)?))).collect()
}

/// The member `name` of an object at `at`, read as `fields` and `lists`
/// declare it. Its path is formatted for an error only: a document read
/// back from an index reads every member.
fn member_from_json(at: &str, fields: &[Field], lists: &[Nested], name: &str, v: &Json) -> Result<Value, Invalid> {
    let here = || format!("{at}.{name}");
    if let Some(list) = lists.iter().find(|l| l.name == name) {
        let Json::Array(items) = v else { return Err(Invalid::new(here(), "is not a list of objects")) };
        return Ok(Value::Objects(items.iter().enumerate().map(|(i, o)| object_from_json(&format!("{}[{i}]", here()), &list.fields, &[], o)).collect::<Result<_, _>>()?));
    }
    let f = fields.iter().find(|f| f.name == name).ok_or_else(|| Invalid::new(here(), "is not a field of the kind"))?;
    // Read at "", an error's path is what lies below the member ("[2]").
    from_json("", f, v).map_err(|e| Invalid { field: format!("{}{}", here(), e.field), ..e })
}

/// The JSON a value is written as in a JSONL line.
pub fn to_json(v: &Value) -> Json {
    match v {
        Value::Str(s) => Json::String(s.clone()),
        Value::Int(i) => Json::from(*i),
        Value::Float(x) => Json::from(*x),
        Value::Bool(b) => Json::Bool(*b),
        Value::List(items) => Json::Array(items.iter().cloned().map(Json::String).collect()),
        Value::Objects(objects) => Json::Array(objects.iter().map(object_to_json).collect()),
    }
}

pub fn object_to_json(o: &Object) -> Json {
    Json::Object(o.iter().map(|(k, v)| (k.clone(), to_json(v))).collect())
}

/// A model document as JSON (an index's `_source`): its id, its fields
/// and nested lists, and each copy as an object of the fields its owner
/// has.
pub fn document_json(id: &str, fields: &Object, copies: &BTreeMap<String, Object>) -> Json {
    let mut out: serde_json::Map<String, Json> = fields.iter().map(|(k, v)| (k.clone(), to_json(v))).collect();
    for (name, copy) in copies {
        out.insert(name.clone(), object_to_json(copy));
    }
    out.insert("id".into(), id.into());
    Json::Object(out)
}

/// [`document_json`] as text, written without building the JSON tree
/// (what the embedded index stores for each document it writes).
pub fn document_json_text(id: &str, fields: &Object, copies: &BTreeMap<String, Object>) -> String {
    serde_json::to_string(&DocumentJson { id, fields, copies }).expect("a model document serializes")
}

struct DocumentJson<'a> {
    id: &'a str,
    fields: &'a Object,
    copies: &'a BTreeMap<String, Object>,
}

/// A member of [`DocumentJson`]: its members are sorted by name, and a
/// copy's name, then `id`, stands over a field of the same name, as in
/// [`document_json`].
enum Member<'a> {
    Field(&'a Value),
    Copy(&'a Object),
    Id(&'a str),
}

impl serde::Serialize for DocumentJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut members: BTreeMap<&str, Member<'_>> = self.fields.iter().map(|(k, v)| (k.as_str(), Member::Field(v))).collect();
        members.extend(self.copies.iter().map(|(k, o)| (k.as_str(), Member::Copy(o))));
        members.insert("id", Member::Id(self.id));
        s.collect_map(members)
    }
}

impl serde::Serialize for Member<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Member::Field(v) => v.serialize(s),
            Member::Copy(o) => s.collect_map(o.iter()),
            Member::Id(id) => s.serialize_str(id),
        }
    }
}

/// A value as [`to_json`] gives it.
impl serde::Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Str(v) => s.serialize_str(v),
            Value::Int(i) => s.serialize_i64(*i),
            Value::Float(x) if x.is_finite() => s.serialize_f64(*x),
            Value::Float(_) => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::List(items) => s.collect_seq(items),
            Value::Objects(objects) => s.collect_seq(objects),
        }
    }
}

/// A model document's JSON ([`document_json`]) read back: its id, its
/// fields and nested lists, and its copies. Members `store` names are the
/// store's own bookkeeping, passed over.
pub fn document_from_json(d: &Domain, kind: &Kind, j: &Json, store: &dyn Fn(&str) -> bool) -> Result<(String, Object, BTreeMap<String, Object>), Invalid> {
    let Json::Object(m) = j else { return Err(Invalid::new(&kind.name, "is not a JSON object")) };
    let (mut id, mut fields, mut copies) = (None, Object::new(), BTreeMap::new());
    for (name, v) in m {
        if name == "id" {
            id = v.as_str().map(str::to_string);
        } else if let Some(c) = kind.copies.iter().find(|c| &c.name == name) {
            let owner = d.kind(&c.owner).ok_or_else(|| Invalid::new(name, "copies a kind the model does not have"))?;
            let copied: Vec<Field> = owner.fields.iter().filter(|f| c.fields.contains(&f.name)).cloned().collect();
            copies.insert(name.clone(), object_from_json(name, &copied, &[], v)?);
        } else if !store(name) {
            fields.insert(name.clone(), member_from_json(&kind.name, &kind.fields, &kind.nested, name, v)?);
        }
    }
    let id = id.ok_or_else(|| Invalid::new("id", "is missing or not a string"))?;
    Ok((id, fields, copies))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(ty: FieldType) -> Field {
        Field { name: "f".into(), ty, optional: false }
    }

    #[test]
    fn dates_and_times_of_iso_8601_are_taken_and_others_refused() {
        for ok in ["2026-12-04", "2026-12-04T10:00:00", "2026-12-04T23:59:59.123Z", "2024-02-29T00:00:00.123456789+05:30", "2026-12-04T10:00:00-08:00"] {
            assert_eq!(check_date("d", ok), Ok(()), "{ok}");
        }
        for bad in [
            "2026-13-01",
            "2023-02-29",
            "2026-12-04T24:00:00",
            "2026-12-04T10:00",
            "2026-12-04T10:00:00.Z",
            "2026-12-04T10:00:00+0530",
            "2026-12-04 10:00:00",
            "2026-12-04T10:00:00.1234567890Z",
            "04/12/2026",
            "2026-12-0é",
        ] {
            assert!(check_date("d", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_values_are_read_as_their_fields_type() {
        assert_eq!(from_json("f", &field(FieldType::Float), &serde_json::json!(3)), Ok(Value::Float(3.0)));
        assert_eq!(from_json("f", &field(FieldType::Integer), &serde_json::json!(3)), Ok(Value::Int(3)));
        assert!(from_json("f", &field(FieldType::Integer), &serde_json::json!(3.5)).is_err());
        assert!(from_json("f", &field(FieldType::Keyword), &serde_json::json!(3)).is_err());
        assert!(from_json("f", &field(FieldType::Boolean), &serde_json::json!("true")).is_err());
        let e = from_json("fields.tags", &field(FieldType::Keywords), &serde_json::json!(["a", 1])).unwrap_err();
        assert_eq!(e.field, "fields.tags[1]");
        // Within an object, an error names the member's whole path.
        let tags = Field { name: "tags".into(), ..field(FieldType::Keywords) };
        let e = object_from_json("fields", std::slice::from_ref(&tags), &[], &serde_json::json!({"tags": ["a", 1]})).unwrap_err();
        assert_eq!((e.field.as_str(), e.reason.as_str()), ("fields.tags[1]", "is not a string"));
        let e = object_from_json("fields", &[tags], &[], &serde_json::json!({"tags": 3})).unwrap_err();
        assert_eq!(e.field, "fields.tags");
        assert!(from_json("f", &field(FieldType::Path), &serde_json::json!("relative/p")).is_err());
        assert!(from_json("f", &field(FieldType::Ref { kind: "user".into() }), &serde_json::json!("")).is_err());
    }

    #[test]
    fn a_documents_json_text_is_its_json_tree_written_out() {
        let o = |pairs: &[(&str, Value)]| -> Object { pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect() };
        let line = o(&[("sku", Value::Str("a-1 \"quoted\" é".into())), ("qty", Value::Int(-3)), ("price", Value::Float(2.5))]);
        let fields = o(&[
            ("title", Value::Str("t\n".into())),
            ("n", Value::Int(i64::MAX)),
            ("x", Value::Float(1e300)),
            ("tiny", Value::Float(-1.25e-7)),
            ("whole", Value::Float(3.0)),
            ("ok", Value::Bool(false)),
            ("tags", Value::List(vec!["b".into(), "a".into()])),
            ("none", Value::List(Vec::new())),
            ("lines", Value::Objects(vec![line.clone(), Object::new()])),
            ("user", Value::Str("a field a copy's name stands over".into())),
            ("id", Value::Str("a field the id stands over".into())),
        ]);
        let copies: BTreeMap<String, Object> = [("user".to_string(), o(&[("name", Value::Str("Ann".into()))])), ("empty".to_string(), Object::new())].into_iter().collect();
        for (id, fields, copies) in [("p-1", &fields, &copies), ("", &Object::new(), &BTreeMap::new()), ("l", &line, &BTreeMap::new())] {
            assert_eq!(document_json_text(id, fields, copies), document_json(id, fields, copies).to_string());
        }
    }

    #[test]
    fn values_past_the_limits_are_refused() {
        let long = Value::Str("x".repeat(MAX_TERM_LEN + 1));
        assert!(check("f", &field(FieldType::Keyword), &long).is_err());
        let text = |exact| field(FieldType::Text { analyzer: crate::domain::Analyzer::Standard, exact });
        assert_eq!(check("f", &text(false), &long), Ok(()));
        assert!(check("f", &text(true), &long).is_err());
        assert!(check("f", &field(FieldType::Keywords), &Value::List(vec![String::new(); MAX_LIST + 1])).is_err());
        assert!(check("f", &field(FieldType::Float), &Value::Float(f64::NAN)).is_err());
        let objects = Value::Objects(vec![Object::new(); MAX_LIST + 1]);
        assert!(check_objects("f", &[], &objects).unwrap_err().reason.contains("more than 1024"));
    }
}
