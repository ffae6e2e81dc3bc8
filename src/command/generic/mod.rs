//! The commands every model gets (docs/model.md, "Commands"): upsert a
//! document, patch some of its fields, delete it, rename a prefix of its
//! path, and an owner change (an upsert that names the key it leaves).
//! Read from JSONL ([`jsonl`]) or Avro (`crate::codec::model`) and checked
//! against the model: a command that passes names a kind of the model,
//! only fields it declares, with values of their types, and has an
//! ordering key.

pub mod bound;
pub mod jsonl;
pub mod legacy;
pub mod value;

use crate::command::{path, tenant, LogPosition, Repair};
use crate::domain::{Domain, Kind, OrderingKey};

use value::{check_id, check_object, check_path};
pub use value::{Invalid, Object, Value};

/// One command of a model's log: what it does to a document of `kind`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCommand {
    pub kind: String,
    pub op: Op,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Create or replace a document: `fields` holds its declared fields
    /// and nested lists (a list left out is empty). `previous` makes it an
    /// owner change: the value the kind's key field had (the owner's id, the
    /// path), when that is another ordering key.
    Upsert {
        id: String,
        fields: Object,
        previous: Option<String>,
    },
    /// Set some fields of a document, leaving the others. `at` is the value
    /// of the kind's key field (`None` for a kind keyed by its id), which
    /// a patch cannot change. A patch of fields that dependents copy is
    /// what fans out to them.
    Patch {
        id: String,
        at: Option<String>,
        set: Object,
    },
    Delete {
        id: String,
        at: Option<String>,
    },
    /// Rename a prefix of the path of every document of a kind keyed by
    /// its path that lies beneath it (or is it), within one top segment.
    RenamePrefix {
        from: String,
        to: String,
    },
}

impl Op {
    /// The document it writes (none for a rename).
    pub fn id(&self) -> Option<&str> {
        match self {
            Op::Upsert { id, .. } | Op::Patch { id, .. } | Op::Delete { id, .. } => Some(id),
            Op::RenamePrefix { .. } => None,
        }
    }

    /// The name a JSONL line gives the operation (and a metrics label).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Upsert { .. } => "upsert",
            Op::Patch { .. } => "patch",
            Op::Delete { .. } => "delete",
            Op::RenamePrefix { .. } => "rename_prefix",
        }
    }
}

/// A model command with what travels beside it, as in
/// [`crate::command::Envelope`].
#[derive(Debug, Clone, PartialEq)]
pub struct ModelEnvelope {
    pub command_id: String,
    /// Milliseconds since the Unix epoch.
    pub issued_at: i64,
    pub tenant: Option<String>,
    pub after: Option<LogPosition>,
    pub repair: Option<Repair>,
    pub command: ModelCommand,
}

impl ModelEnvelope {
    /// Wraps `command` with a fresh id and the current time.
    pub fn new(command: ModelCommand, tenant: Option<String>) -> Self {
        ModelEnvelope { command_id: uuid::Uuid::new_v4().to_string(), issued_at: crate::clock::now_millis(), tenant, after: None, repair: None, command }
    }

    /// Checks the tenant and the command against the model: what a worker
    /// admits.
    pub fn validate(&self, d: &Domain) -> Result<(), Invalid> {
        if let Some(t) = &self.tenant {
            tenant::validate(t).map_err(|e| Invalid::new("tenant", e.to_string()))?;
        }
        self.command.validate(d)
    }
}

impl ModelCommand {
    /// The declaration of the command's kind.
    pub fn kind_in<'d>(&self, d: &'d Domain) -> Result<&'d Kind, Invalid> {
        kind_named(d, &self.kind)
    }

    /// Checks every field against the model.
    pub fn validate(&self, d: &Domain) -> Result<(), Invalid> {
        let kind = self.kind_in(d)?;
        let key_field = kind.key_field();
        match &self.op {
            Op::Upsert { id, fields, previous } => {
                check_id("id", id)?;
                check_object("fields", &kind.fields, &kind.nested, fields, true)?;
                if let OrderingKey::PathTop { field } = &kind.key {
                    below_top(&format!("fields.{field}"), key_value(kind, fields))?;
                }
                match (key_field, previous) {
                    (_, None) => Ok(()),
                    (None, Some(_)) => Err(Invalid::new("previous", format!("is for kinds keyed by an owner or a path; {} is keyed by its id", kind.name))),
                    (Some(f), Some(p)) => check_key_value(kind, &format!("previous_{f}"), p),
                }
            }
            Op::Patch { id, at, set } => {
                check_id("id", id)?;
                check_at(kind, at)?;
                if set.is_empty() {
                    return Err(Invalid::new("set", "is empty: a patch sets one field or more"));
                }
                if let Some(f) = key_field.filter(|f| set.contains_key(*f)) {
                    return Err(Invalid::new(format!("set.{f}"), format!("is the ordering key of {}: an upsert with previous_{f} changes it", kind.name)));
                }
                check_object("set", &kind.fields, &kind.nested, set, false)
            }
            Op::Delete { id, at } => {
                check_id("id", id)?;
                check_at(kind, at)
            }
            Op::RenamePrefix { from, to } => {
                let OrderingKey::PathTop { .. } = &kind.key else {
                    return Err(Invalid::new("kind", format!("{} is not keyed by a path: only such a kind's prefixes are renamed", kind.name)));
                };
                check_path("from", from)?;
                check_path("to", to)?;
                below_top("from", from)?;
                below_top("to", to)?;
                if path::is_within(to, from) {
                    return Err(Invalid::new("to", format!("{to:?} lies within {from:?}: a prefix is not renamed into itself")));
                }
                if path::top_level(from) != path::top_level(to) {
                    return Err(Invalid::new("to", format!("{to:?} is under another top segment than {from:?} (another ordering key): not supported for model commands yet")));
                }
                Ok(())
            }
        }
    }

    /// The ordering key: the Kafka key the command is produced with, and so
    /// the order it is applied in. Valid commands only.
    pub fn key<'c>(&'c self, kind: &Kind) -> &'c str {
        let of_value = |v: &'c str| match &kind.key {
            OrderingKey::PathTop { .. } => path::top_level(v),
            _ => v,
        };
        match (&self.op, kind.key_field()) {
            (Op::Upsert { id, .. } | Op::Patch { id, .. } | Op::Delete { id, .. }, None) => id,
            (Op::Upsert { fields, .. }, Some(_)) => of_value(key_value(kind, fields)),
            (Op::Patch { at, .. } | Op::Delete { at, .. }, Some(_)) => of_value(at.as_deref().expect("a valid command has its key")),
            (Op::RenamePrefix { from, .. }, _) => path::top_level(from),
        }
    }

    /// For an owner change: the key the document leaves. Its copy there is
    /// deleted first ([`ModelCommand::owner_change_delete`]). An upsert
    /// whose `previous` has the same key is a plain upsert. Valid commands
    /// only.
    pub fn previous_key<'c>(&'c self, kind: &Kind) -> Option<&'c str> {
        let Op::Upsert { previous: Some(p), .. } = &self.op else { return None };
        let previous = match &kind.key {
            OrderingKey::PathTop { .. } => path::top_level(p),
            _ => p.as_str(),
        };
        (previous != self.key(kind)).then_some(previous)
    }

    /// For an owner change: its first half, the delete of the document
    /// under the key it leaves.
    pub fn owner_change_delete(&self, kind: &Kind) -> Option<ModelCommand> {
        self.previous_key(kind)?;
        let Op::Upsert { id, previous, .. } = &self.op else { return None };
        Some(ModelCommand { kind: self.kind.clone(), op: Op::Delete { id: id.clone(), at: previous.clone() } })
    }
}

/// The declaration of the kind `name`, or why a command cannot name it.
pub fn kind_named<'d>(d: &'d Domain, name: &str) -> Result<&'d Kind, Invalid> {
    d.kind(name).ok_or_else(|| Invalid::new("kind", format!("{name:?} is not a kind of model {}", d.name)))
}

/// The key field's value in a checked upsert's fields.
fn key_value<'f>(kind: &Kind, fields: &'f Object) -> &'f str {
    match kind.key_field().and_then(|f| fields.get(f)) {
        Some(Value::Str(s)) => s,
        _ => unreachable!("a checked upsert has its key field, a string"),
    }
}

/// Checks `at` of a patch or a delete: there for a kind keyed by a field,
/// a value of that field's type.
fn check_at(kind: &Kind, at: &Option<String>) -> Result<(), Invalid> {
    match (kind.key_field(), at) {
        (None, None) => Ok(()),
        (None, Some(_)) => Err(Invalid::new("at", format!("names a key, but {} is keyed by its id", kind.name))),
        (Some(f), None) => Err(Invalid::new(f, format!("is required: it is the ordering key of {}", kind.name))),
        (Some(f), Some(v)) => check_key_value(kind, f, v),
    }
}

/// Checks a value of the kind's key field, named `at`.
fn check_key_value(kind: &Kind, at: &str, v: &str) -> Result<(), Invalid> {
    match &kind.key {
        OrderingKey::PathTop { .. } => {
            check_path(at, v)?;
            below_top(at, v)
        }
        _ => check_id(at, v),
    }
}

/// A path of a kind keyed by its top segment must lie below it: the top
/// alone is the key, not a document's place.
fn below_top(at: &str, p: &str) -> Result<(), Invalid> {
    if path::depth(p) < 2 {
        return Err(Invalid::new(at, format!("{p:?} must lie below a top segment, its ordering key")));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
