//! Avro values and the topic's message types: a command's payload branch
//! and its fields, and the records of commands, control messages and move
//! chunks read back from values (Avro's resolution rules: fields by name,
//! defaults for what the writer lacked).

use std::collections::HashMap;

use apache_avro::schema::Schema;
use apache_avro::types::Value;

use super::DecodeError;
use crate::command::control::Control;
use crate::command::moves::{MoveIn, MovedFile};
use crate::command::{Command, Envelope, LogPosition, Repair};

/// The Avro record of `c`'s payload branch, without namespace
/// (`UpsertFile`, ...).
pub fn record_name(c: &Command) -> &'static str {
    payload_fields(c).0
}

fn payload_fields(c: &Command) -> (&'static str, Vec<(&'static str, &str)>) {
    match c {
        Command::UpsertFile { id, path, contents, .. } => ("UpsertFile", vec![("id", id), ("path", path), ("contents", contents)]),
        Command::DeleteFile { id, path } => ("DeleteFile", vec![("id", id), ("path", path)]),
        Command::RenamePath { from, to } => ("RenamePath", vec![("from", from), ("to", to)]),
        Command::UpsertUser { id, name, email, dob } => ("UpsertUser", vec![("id", id), ("name", name), ("email", email), ("dob", dob)]),
        Command::UpsertPost { id, user_id, title, body, .. } => ("UpsertPost", vec![("id", id), ("user_id", user_id), ("title", title), ("body", body)]),
        Command::DeletePost { id, user_id } => ("DeletePost", vec![("id", id), ("user_id", user_id)]),
        Command::DeleteUser { id } => ("DeleteUser", vec![("id", id)]),
        Command::Model(_) => unreachable!("a model's commands are written by its codec (`Codec::encode`)"),
    }
}

/// The payload union's branches, in schema order (borrowed: this runs for
/// every message encoded or decoded).
fn payload_branches(schema: &Schema) -> &[Schema] {
    let Schema::Record(r) = schema else { return &[] };
    let Some(f) = r.fields.iter().find(|f| f.name == "payload") else { return &[] };
    let Schema::Union(u) = &f.schema else { return &[] };
    u.variants()
}

/// The record name of a payload branch ("" for a non-record branch).
fn branch_name(branch: &Schema) -> &str {
    match branch {
        Schema::Record(r) => &r.name.name,
        _ => "",
    }
}

/// An optional string as the union `["null", "string"]`.
fn optional(v: Option<&String>) -> Value {
    match v {
        Some(s) => Value::Union(1, Box::new(Value::String(s.clone()))),
        None => Value::Union(0, Box::new(Value::Null)),
    }
}

/// Builds the Avro value of `e` for `schema` (which must have every field
/// this version writes; `tenant`, `after` and `repair` are written only when the
/// schema has them).
pub fn to_value(schema: &Schema, e: &Envelope) -> Value {
    // A tenant's command is held scoped, and written as its producer wrote
    // it (see `crate::command::tenant`).
    let unscoped;
    let command = match e.tenant {
        None => &e.command,
        Some(_) => {
            unscoped = e.command.unscoped();
            &unscoped
        }
    };
    let (name, fields) = payload_fields(command);
    let branches = payload_branches(schema);
    let branch = branches.iter().position(|b| branch_name(b) == name).expect("known payload");
    let mut payload: Vec<(String, Value)> = fields.into_iter().map(|(k, v)| (k.to_string(), Value::String(v.to_string()))).collect();
    // Written only by the schema versions that have it (3 on).
    let previous = match command {
        Command::UpsertFile { previous_path, .. } => Some(("previous_path", previous_path)),
        Command::UpsertPost { previous_user_id, .. } => Some(("previous_user_id", previous_user_id)),
        _ => None,
    };
    let has = |field: &str| matches!(&branches[branch], Schema::Record(r) if r.fields.iter().any(|f| f.name == field));
    if let Some((field, value)) = previous.filter(|(f, _)| has(f)) {
        payload.push((field.to_string(), optional(value.as_ref())));
    }
    let (branch, payload) = (branch as u32, Value::Record(payload));
    let mut out = head_values(schema, &e.command_id, e.issued_at, e.tenant.as_ref(), e.after, e.repair);
    out.push(("payload".to_string(), Value::Union(branch, Box::new(payload))));
    Value::Record(out)
}

pub(super) fn from_value(writer: &Schema, value: Value) -> Result<Envelope, DecodeError> {
    let shape = |m: &str| DecodeError::Shape(m.to_string());
    let Value::Record(fields) = value else { return Err(shape("not a record")) };
    let mut fields: HashMap<String, Value> = fields.into_iter().collect();
    let Head { command_id, issued_at, tenant, after, repair } = head_from(&mut fields)?;
    let Some(Value::Union(i, payload)) = fields.remove("payload") else {
        return Err(shape("payload is missing or not a union"));
    };
    let name = payload_branches(writer).get(i as usize).map_or("", branch_name);
    let Value::Record(p) = *payload else { return Err(shape("payload is not a record")) };
    let mut p: HashMap<String, Value> = p.into_iter().collect();
    let mut f = |k: &'static str| string(p.remove(k), k);
    let command = match name {
        "UpsertFile" => Command::UpsertFile { id: f("id")?, path: f("path")?, contents: f("contents")?, previous_path: optional_string(p.remove("previous_path"), "previous_path")? },
        "DeleteFile" => Command::DeleteFile { id: f("id")?, path: f("path")? },
        "RenamePath" => Command::RenamePath { from: f("from")?, to: f("to")? },
        "UpsertUser" => Command::UpsertUser { id: f("id")?, name: f("name")?, email: f("email")?, dob: f("dob")? },
        "UpsertPost" => {
            Command::UpsertPost { id: f("id")?, user_id: f("user_id")?, title: f("title")?, body: f("body")?, previous_user_id: optional_string(p.remove("previous_user_id"), "previous_user_id")? }
        }
        "DeletePost" => Command::DeletePost { id: f("id")?, user_id: f("user_id")? },
        "DeleteUser" => Command::DeleteUser { id: f("id")? },
        other => return Err(DecodeError::Shape(format!("unknown payload type {other:?}"))),
    };
    // Scoped to its tenant from here on (see `crate::command::tenant`).
    let command = command.scoped(tenant.as_deref());
    Ok(Envelope { command_id, issued_at, tenant, after, repair, command })
}

/// What every command's envelope carries besides its payload.
pub(super) struct Head {
    pub command_id: String,
    pub issued_at: i64,
    pub tenant: Option<String>,
    pub after: Option<LogPosition>,
    pub repair: Option<Repair>,
}

/// The envelope's fields before its payload, as `schema` (a command
/// schema, of any version) has them.
pub(super) fn head_values(schema: &Schema, command_id: &str, issued_at: i64, tenant: Option<&String>, after: Option<LogPosition>, repair: Option<Repair>) -> Vec<(String, Value)> {
    let Schema::Record(r) = schema else { panic!("command schema is a record") };
    let mut out = vec![("command_id".to_string(), Value::String(command_id.to_string())), ("issued_at".to_string(), Value::TimestampMillis(issued_at))];
    if r.fields.iter().any(|f| f.name == "tenant") {
        out.push(("tenant".to_string(), optional(tenant)));
    }
    if r.fields.iter().any(|f| f.name == "after") {
        let after = match after {
            None => Value::Union(0, Box::new(Value::Null)),
            Some(at) => Value::Union(1, Box::new(Value::Record(vec![("partition".into(), Value::Int(at.partition)), ("offset".into(), Value::Long(at.offset))]))),
        };
        out.push(("after".to_string(), after));
    }
    if let Some(field) = r.fields.iter().find(|f| f.name == "repair") {
        // `seen` from version 6 on.
        let says_seen = matches!(&field.schema, Schema::Union(u) if u.variants().iter().any(|v| matches!(v, Schema::Record(rr) if rr.fields.iter().any(|f| f.name == "seen"))));
        let repair = match repair {
            None => Value::Union(0, Box::new(Value::Null)),
            Some(rep) => {
                let mut fields = vec![("unchanged_since".to_string(), Value::Long(rep.unchanged_since))];
                if says_seen {
                    let seen = match rep.seen {
                        None => Value::Union(0, Box::new(Value::Null)),
                        Some(b) => Value::Union(1, Box::new(Value::Boolean(b))),
                    };
                    fields.push(("seen".to_string(), seen));
                }
                Value::Union(1, Box::new(Value::Record(fields)))
            }
        };
        out.push(("repair".to_string(), repair));
    }
    out
}

/// The envelope's fields before its payload, taken out of a decoded
/// command's fields.
pub(super) fn head_from(fields: &mut HashMap<String, Value>) -> Result<Head, DecodeError> {
    let shape = |m: &str| DecodeError::Shape(m.to_string());
    let command_id = string(fields.remove("command_id"), "command_id")?;
    let issued_at = match fields.remove("issued_at") {
        Some(Value::TimestampMillis(t)) | Some(Value::Long(t)) => t,
        _ => return Err(shape("issued_at is missing or not a long")),
    };
    let tenant = optional_string(fields.remove("tenant"), "tenant")?;
    let after = match fields.remove("after") {
        None | Some(Value::Null) => None,
        Some(Value::Union(_, v)) if *v == Value::Null => None,
        Some(Value::Union(_, v)) => {
            let mut at = record_fields(*v, "after")?;
            Some(LogPosition { partition: number(at.remove("partition"), "after", "partition")? as i32, offset: number(at.remove("offset"), "after", "offset")? })
        }
        Some(_) => return Err(shape("after is not a union")),
    };
    let repair = match fields.remove("repair") {
        None | Some(Value::Null) => None,
        Some(Value::Union(_, v)) if *v == Value::Null => None,
        Some(Value::Union(_, v)) => {
            let mut r = record_fields(*v, "repair")?;
            let seen = match r.remove("seen") {
                None | Some(Value::Null) => None,
                Some(Value::Union(_, b)) => match *b {
                    Value::Null => None,
                    Value::Boolean(b) => Some(b),
                    _ => return Err(shape("repair.seen is not a boolean")),
                },
                Some(Value::Boolean(b)) => Some(b),
                Some(_) => return Err(shape("repair.seen is not a boolean")),
            };
            Some(Repair { unchanged_since: number(r.remove("unchanged_since"), "repair", "unchanged_since")?, seen })
        }
        Some(_) => return Err(shape("repair is not a union")),
    };
    Ok(Head { command_id, issued_at, tenant, after, repair })
}

/// The fields of a record `what` is, by name.
fn record_fields(value: Value, what: &str) -> Result<HashMap<String, Value>, DecodeError> {
    match value {
        Value::Record(fields) => Ok(fields.into_iter().collect()),
        _ => Err(DecodeError::Shape(format!("{what} is not a record"))),
    }
}

/// An integer field (int, long or timestamp) of a `what`.
fn number(v: Option<Value>, what: &str, name: &str) -> Result<i64, DecodeError> {
    match v {
        Some(Value::Long(x)) | Some(Value::TimestampMillis(x)) => Ok(x),
        Some(Value::Int(x)) => Ok(x as i64),
        _ => Err(DecodeError::Shape(format!("{what} field {name} is missing or not a number"))),
    }
}

pub(super) fn control_from_value(value: Value) -> Result<Control, DecodeError> {
    let shape = |m: &str| DecodeError::Shape(m.to_string());
    let mut f = record_fields(value, "control message")?;
    let long = |v: Option<Value>, name: &str| number(v, "control", name);
    let action = string(f.remove("action"), "action")?;
    let action = crate::command::control::Action::parse(&action).ok_or_else(|| DecodeError::Shape(format!("unknown control action {action:?}")))?;
    Ok(Control {
        action,
        key: string(f.remove("key"), "key")?,
        dlq_partition: long(f.remove("dlq_partition"), "dlq_partition")? as i32,
        dlq_offset: long(f.remove("dlq_offset"), "dlq_offset")?,
        through: long(f.remove("through"), "through")?,
        origin_offset: long(f.remove("origin_offset"), "origin_offset")?,
        payload: match f.remove("payload") {
            Some(Value::Bytes(b)) => b,
            _ => return Err(shape("control field payload is missing or not bytes")),
        },
        requested_at: long(f.remove("requested_at"), "requested_at")?,
        // Absent from version 1 of the schema.
        through_at: f.remove("through_at").map_or(Ok(-1), |v| long(Some(v), "through_at"))?,
    })
}

pub(super) fn move_from_value(value: Value) -> Result<MoveIn, DecodeError> {
    let shape = |m: &str| DecodeError::Shape(m.to_string());
    let mut f = record_fields(value, "move message")?;
    let long = |v: Option<Value>, name: &str| number(v, "move", name);
    let Some(Value::Array(items)) = f.remove("files") else { return Err(shape("move field files is missing or not an array")) };
    let files = items
        .into_iter()
        .map(|item| {
            let mut g = record_fields(item, "a moved file")?;
            Ok(MovedFile { id: string(g.remove("id"), "id")?, path: string(g.remove("path"), "path")?, contents: string(g.remove("contents"), "contents")? })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(MoveIn {
        move_id: string(f.remove("move_id"), "move_id")?,
        source_partition: long(f.remove("source_partition"), "source_partition")? as i32,
        source_offset: long(f.remove("source_offset"), "source_offset")?,
        from: string(f.remove("from"), "from")?,
        to: string(f.remove("to"), "to")?,
        chunk: long(f.remove("chunk"), "chunk")? as i32,
        last: matches!(f.remove("last"), Some(Value::Boolean(true))),
        issued_at: long(f.remove("issued_at"), "issued_at")?,
        files,
        // Absent from version 1 of the schema.
        aborted: matches!(f.remove("aborted"), Some(Value::Boolean(true))),
    })
}

/// An optional string field: absent from older writer schemas, or the
/// union `["null", "string"]`.
fn optional_string(v: Option<Value>, field: &str) -> Result<Option<String>, DecodeError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Union(_, v)) => optional_string(Some(*v), field),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(DecodeError::Shape(format!("{field} is not a string"))),
    }
}

fn string(v: Option<Value>, field: &str) -> Result<String, DecodeError> {
    match v {
        Some(Value::String(s)) => Ok(s),
        Some(Value::Uuid(u)) => Ok(u.to_string()),
        _ => Err(DecodeError::Shape(format!("{field} is missing or not a string"))),
    }
}
