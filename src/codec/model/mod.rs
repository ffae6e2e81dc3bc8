//! Avro encoding of a model's commands ([`ModelEnvelope`]), with the
//! schema [`schema::schema`] writes for the model: single-object encoding,
//! as for the compiled-in commands (`super`). Decoding gives the command
//! as written; [`ModelEnvelope::validate`] then checks it against the
//! model, as a worker does before it applies anything.

pub mod schema;

use std::collections::HashMap;

use apache_avro::schema::Schema;
use apache_avro::types::Value as Avro;

use super::value::{head_from, head_values, Head};
use super::{canonical, encode_value, hex, read_datum, single_object, DecodeError};
use crate::command::generic::{ModelCommand, ModelEnvelope, Object, Op, Value};
use crate::domain::{Domain, Field, FieldType, Kind, Nested};
use schema::Branch;

/// The encoder and decoder of one model's commands.
pub struct ModelCodec {
    domain: Domain,
    text: String,
    schema: Schema,
    fingerprint: [u8; 8],
    /// The payload union's branches, in order: (index of the kind, operation).
    branches: Vec<(usize, Branch)>,
}

impl ModelCodec {
    pub fn new(domain: Domain) -> Self {
        super::limit_allocations();
        let text = schema::to_text(&schema::schema(&domain));
        let schema = Schema::parse_str(&text).unwrap_or_else(|e| panic!("the schema of a checked model is valid Avro: {e}\n{text}"));
        let fingerprint = canonical::fingerprint(&text).expect("a valid schema has a canonical form");
        let branches = domain.kinds.iter().enumerate().flat_map(|(i, k)| schema::branches(k).iter().map(move |b| (i, *b))).collect();
        ModelCodec { domain, text, schema, fingerprint, branches }
    }

    pub fn domain(&self) -> &Domain {
        &self.domain
    }

    /// The schema as JSON text (what `denorm schema --model` prints).
    pub fn schema_text(&self) -> &str {
        &self.text
    }

    /// The schema's CRC-64-AVRO fingerprint (hex, the bytes after `C3 01`).
    pub fn fingerprint(&self) -> String {
        hex(&self.fingerprint)
    }

    /// Whether the schema of fingerprint `fp` is this model's: a
    /// single-object message's, or the canonical fingerprint of a schema
    /// registry's writer schema.
    pub fn writes(&self, fp: &[u8; 8]) -> bool {
        *fp == self.fingerprint
    }

    /// Encodes a command checked against the model, in single-object
    /// encoding.
    pub fn encode(&self, e: &ModelEnvelope) -> Vec<u8> {
        encode_value(&self.schema, self.fingerprint, self.value(e))
    }

    /// The binary Avro datum of a checked command, without any framing (a
    /// schema registry's framing wraps it).
    pub fn datum(&self, e: &ModelEnvelope) -> Vec<u8> {
        apache_avro::to_avro_datum(&self.schema, self.value(e)).expect("a checked command matches its model's schema")
    }

    fn value(&self, e: &ModelEnvelope) -> Avro {
        let k = self.domain.kinds.iter().position(|k| k.name == e.command.kind).expect("a checked command's kind");
        let kind = &self.domain.kinds[k];
        let key = kind.key_field();
        let (branch, fields) = match &e.command.op {
            Op::Upsert { id, fields, previous } => {
                let mut out = vec![string("id", id)];
                if let Some(f) = key {
                    out.push((format!("previous_{f}"), optional(previous.as_ref().map(|p| Avro::String(p.clone())))));
                }
                out.push(("fields".into(), Avro::Record(document(kind, fields))));
                (Branch::Upsert, out)
            }
            Op::Patch { id, at, set } => {
                let mut out = vec![string("id", id)];
                out.extend(key.map(|f| string(f, at.as_deref().expect("a checked patch has its key"))));
                let mut changes: Vec<(String, Avro)> = kind.fields.iter().filter(|f| Some(f.name.as_str()) != key).map(|f| (f.name.clone(), optional(set.get(&f.name).map(|v| value(f, v))))).collect();
                changes.extend(kind.nested.iter().map(|n| (n.name.clone(), optional(set.get(&n.name).map(|v| objects(&n.fields, v))))));
                out.push(("set".into(), Avro::Record(changes)));
                (Branch::Patch, out)
            }
            Op::Delete { id, at } => {
                let mut out = vec![string("id", id)];
                out.extend(key.map(|f| string(f, at.as_deref().expect("a checked delete has its key"))));
                (Branch::Delete, out)
            }
            Op::RenamePrefix { from, to } => (Branch::RenamePrefix, vec![string("from", from), string("to", to)]),
        };
        let index = self.branches.iter().position(|b| *b == (k, branch)).expect("every kind's operations are branches");
        let mut record = head_values(&self.schema, &e.command_id, e.issued_at, e.tenant.as_ref(), e.after, e.repair);
        record.push(("payload".into(), Avro::Union(index as u32, Box::new(Avro::Record(fields)))));
        Avro::Record(record)
    }

    /// Decodes a command written with this model's schema. The command is
    /// as its producer wrote it: validate it before use.
    pub fn decode(&self, bytes: &[u8]) -> Result<ModelEnvelope, DecodeError> {
        let (fp, datum) = single_object(bytes)?;
        if fp != self.fingerprint {
            return Err(DecodeError::UnknownFingerprint(hex(&fp)));
        }
        self.decode_datum(datum)
    }

    /// Decodes one binary datum (all of `datum`) written with this model's
    /// schema; as [`ModelCodec::decode`].
    pub fn decode_datum(&self, datum: &[u8]) -> Result<ModelEnvelope, DecodeError> {
        let shape = |m: String| DecodeError::Shape(m);
        let Avro::Record(fields) = read_datum(&self.schema, datum)? else { return Err(shape("not a record".into())) };
        let mut fields: HashMap<String, Avro> = fields.into_iter().collect();
        let Head { command_id, issued_at, tenant, after, repair } = head_from(&mut fields)?;
        let Some(Avro::Union(i, payload)) = fields.remove("payload") else { return Err(shape("payload is missing or not a union".into())) };
        let &(k, branch) = self.branches.get(i as usize).ok_or_else(|| shape(format!("no payload branch {i}")))?;
        let kind = &self.domain.kinds[k];
        let mut p = record(*payload, "payload")?;
        let key = kind.key_field();
        let op = match branch {
            Branch::Upsert => {
                let id = text(&mut p, "id")?;
                let previous = match key.map(|f| take(&mut p, &format!("previous_{f}"))).transpose()? {
                    None | Some(Avro::Null) => None,
                    Some(Avro::String(s)) => Some(s),
                    Some(_) => return Err(shape("previous is not a string".into())),
                };
                Op::Upsert { id, previous, fields: object(kind, &kind.fields, &kind.nested, take(&mut p, "fields")?, "fields")? }
            }
            Branch::Patch => Op::Patch { id: text(&mut p, "id")?, at: key.map(|f| text(&mut p, f)).transpose()?, set: object(kind, &kind.fields, &kind.nested, take(&mut p, "set")?, "set")? },
            Branch::Delete => Op::Delete { id: text(&mut p, "id")?, at: key.map(|f| text(&mut p, f)).transpose()? },
            Branch::RenamePrefix => Op::RenamePrefix { from: text(&mut p, "from")?, to: text(&mut p, "to")? },
        };
        Ok(ModelEnvelope { command_id, issued_at, tenant, after, repair, command: ModelCommand { kind: kind.name.clone(), op } })
    }
}

/// A field of a decoded record, taken out of it.
fn take(p: &mut HashMap<String, Avro>, name: &str) -> Result<Avro, DecodeError> {
    p.remove(name).map(unwrap_union).ok_or_else(|| DecodeError::Shape(format!("payload has no {name}")))
}

fn text(p: &mut HashMap<String, Avro>, name: &str) -> Result<String, DecodeError> {
    match take(p, name)? {
        Avro::String(s) => Ok(s),
        _ => Err(DecodeError::Shape(format!("payload field {name} is not a string"))),
    }
}

fn string(name: &str, s: &str) -> (String, Avro) {
    (name.to_string(), Avro::String(s.to_string()))
}

/// The union `["null", T]`.
fn optional(v: Option<Avro>) -> Avro {
    match v {
        Some(v) => Avro::Union(1, Box::new(v)),
        None => Avro::Union(0, Box::new(Avro::Null)),
    }
}

/// An upsert's `Fields` record: every declared field, then every nested
/// list (empty where the document has none).
fn document(kind: &Kind, fields: &Object) -> Vec<(String, Avro)> {
    let mut out = declared(&kind.fields, fields);
    out.extend(kind.nested.iter().map(|n| (n.name.clone(), fields.get(&n.name).map_or(Avro::Array(Vec::new()), |v| objects(&n.fields, v)))));
    out
}

/// A record of `fields` in their order: a required field's value, or an
/// optional field's union.
fn declared(fields: &[Field], o: &Object) -> Vec<(String, Avro)> {
    fields
        .iter()
        .map(|f| {
            let v = o.get(&f.name).map(|v| value(f, v));
            (f.name.clone(), if f.optional { optional(v) } else { v.expect("a checked document has its required fields") })
        })
        .collect()
}

fn objects(fields: &[Field], v: &Value) -> Avro {
    let Value::Objects(items) = v else { unreachable!("a checked nested list holds objects") };
    Avro::Array(items.iter().map(|o| Avro::Record(declared(fields, o))).collect())
}

fn value(f: &Field, v: &Value) -> Avro {
    match v {
        Value::Str(s) => Avro::String(s.clone()),
        Value::Int(i) => Avro::Long(*i),
        Value::Float(x) => Avro::Double(*x),
        Value::Bool(b) => Avro::Boolean(*b),
        Value::List(items) => Avro::Array(items.iter().cloned().map(Avro::String).collect()),
        Value::Objects(_) => unreachable!("a field {} of type {} holds no objects", f.name, f.ty.name()),
    }
}

fn unwrap_union(v: Avro) -> Avro {
    match v {
        Avro::Union(_, inner) => *inner,
        other => other,
    }
}

fn record(v: Avro, what: &str) -> Result<HashMap<String, Avro>, DecodeError> {
    match unwrap_union(v) {
        Avro::Record(fields) => Ok(fields.into_iter().collect()),
        _ => Err(DecodeError::Shape(format!("{what} is not a record"))),
    }
}

/// A decoded `Fields`, `Changes` or nested object: the values present
/// (null: absent), read as `fields` and `lists` declare.
fn object(kind: &Kind, fields: &[Field], lists: &[Nested], v: Avro, what: &str) -> Result<Object, DecodeError> {
    let mut out = Object::new();
    for (name, v) in record(v, what)? {
        let v = unwrap_union(v);
        if v == Avro::Null {
            continue;
        }
        let at = format!("{what}.{name}");
        let read = if let Some(f) = fields.iter().find(|f| f.name == name) {
            from_avro(f, v, &at)?
        } else if let Some(list) = lists.iter().find(|n| n.name == name) {
            let Avro::Array(items) = v else { return Err(DecodeError::Shape(format!("{at} is not an array"))) };
            Value::Objects(items.into_iter().enumerate().map(|(i, o)| object(kind, &list.fields, &[], o, &format!("{at}[{i}]"))).collect::<Result<_, _>>()?)
        } else {
            return Err(DecodeError::Shape(format!("{at} is not a field of {}", kind.name)));
        };
        out.insert(name, read);
    }
    Ok(out)
}

fn from_avro(f: &Field, v: Avro, at: &str) -> Result<Value, DecodeError> {
    Ok(match (&f.ty, v) {
        (FieldType::Integer, Avro::Long(i)) => Value::Int(i),
        (FieldType::Float, Avro::Double(x)) => Value::Float(x),
        (FieldType::Boolean, Avro::Boolean(b)) => Value::Bool(b),
        (FieldType::Keywords, Avro::Array(items)) => Value::List(
            items
                .into_iter()
                .map(|s| match s {
                    Avro::String(s) => Ok(s),
                    _ => Err(DecodeError::Shape(format!("{at} holds a non-string"))),
                })
                .collect::<Result<_, _>>()?,
        ),
        (FieldType::Keyword | FieldType::Ref { .. } | FieldType::Text { .. } | FieldType::Date | FieldType::Path, Avro::String(s)) => Value::Str(s),
        _ => return Err(DecodeError::Shape(format!("{at} is not a {} value", f.ty.name()))),
    })
}

#[cfg(test)]
mod tests;
