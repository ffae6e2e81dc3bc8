//! The compiled-in commands as commands of the model that declares their
//! domain, `models/files-and-posts.toml`: what a topic written with any
//! earlier schema version is, read as that model's log.
//!
//! A rename whose `to` lies under another top-level directory (a cross-key
//! move), or that renames a top-level directory itself, maps to a
//! `rename_prefix` that the model's commands do not accept from a producer
//! yet; its meaning (every path beneath `from` renamed) is the same.

use super::{ModelCommand, ModelEnvelope, Object, Op, Value};
use crate::command::{Command, Envelope};

/// The name of the model the compiled-in commands belong to.
pub const MODEL: &str = "files_and_posts";

/// The text of `models/files-and-posts.toml`, as shipped.
pub const TEXT: &str = include_str!("../../../models/files-and-posts.toml");

/// The shipped model of the compiled-in domain ([`TEXT`]), read once.
pub fn domain() -> &'static crate::domain::Domain {
    static DOMAIN: std::sync::OnceLock<&'static crate::domain::Domain> = std::sync::OnceLock::new();
    DOMAIN.get_or_init(|| crate::domain::Domain::parse("files-and-posts.toml", TEXT).expect("the shipped model is valid").interned())
}

/// A compiled-in command as the same command of `domain` (the model
/// `files_and_posts`), bound to it: what a producer of that model sends.
pub fn command_of(domain: &'static crate::domain::Domain, e: &Envelope) -> Command {
    let m = to_model(e);
    Command::Model(Box::new(super::bound::Bound::new(domain, m.tenant, m.command)))
}

/// A compiled-in command as a command of `files_and_posts`, in its
/// tenant, as its producer wrote it (ids and paths unscoped).
pub fn to_model(e: &Envelope) -> ModelEnvelope {
    let s = |v: &String| Value::Str(v.clone());
    let fields = |pairs: &[(&str, &String)]| -> Object { pairs.iter().map(|(k, v)| (k.to_string(), s(v))).collect() };
    if let Some(m) = super::bound::Bound::model_envelope(e) {
        return m;
    }
    let (kind, op) = match e.command.unscoped() {
        Command::UpsertFile { id, path, contents, previous_path } => ("file", Op::Upsert { fields: fields(&[("path", &path), ("contents", &contents)]), id, previous: previous_path }),
        Command::DeleteFile { id, path } => ("file", Op::Delete { id, at: Some(path) }),
        Command::RenamePath { from, to } => ("file", Op::RenamePrefix { from, to }),
        Command::UpsertUser { id, name, email, dob } => ("user", Op::Upsert { fields: fields(&[("name", &name), ("email", &email), ("dob", &dob)]), id, previous: None }),
        Command::UpsertPost { id, user_id, title, body, previous_user_id } => {
            ("post", Op::Upsert { fields: fields(&[("user_id", &user_id), ("title", &title), ("body", &body)]), id, previous: previous_user_id })
        }
        Command::DeletePost { id, user_id } => ("post", Op::Delete { id, at: Some(user_id) }),
        Command::DeleteUser { id } => ("user", Op::Delete { id, at: None }),
        Command::Model(_) => unreachable!("answered above"),
    };
    ModelEnvelope { command_id: e.command_id.clone(), issued_at: e.issued_at, tenant: e.tenant.clone(), after: e.after, repair: e.repair, command: ModelCommand { kind: kind.into(), op } }
}
