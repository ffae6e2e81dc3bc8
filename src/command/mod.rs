//! The domain commands, their ordering keys and validation. No I/O.

pub mod jsonl;
pub mod path;

use serde::{Deserialize, Serialize};

/// Longest id accepted for a file, user or post.
pub const MAX_ID_LEN: usize = 512;

/// Why a command is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("{field} {path:?} {reason}")]
    InvalidPath { field: &'static str, path: String, reason: String },
    #[error("{field} {reason}")]
    InvalidField { field: &'static str, reason: String },
    #[error("rename of {from:?} into itself ({to:?})")]
    RenameIntoItself { from: String, to: String },
    #[error(
        "rename {from:?} -> {to:?} spans ordering keys ({reason}); cross-key renames are not supported yet"
    )]
    CrossKey { from: String, to: String, reason: &'static str },
}

/// One command of the log. The envelope travels with it in [`Envelope`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    UpsertFile { id: String, path: String, contents: String },
    DeleteFile { id: String, path: String },
    #[serde(rename = "rename")]
    RenamePath { from: String, to: String },
    UpsertUser { id: String, name: String, email: String, dob: String },
    UpsertPost { id: String, user_id: String, title: String, body: String },
    DeletePost { id: String, user_id: String },
}

/// A command with its envelope: the unit written to the topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// UUID of this command, chosen by the producer.
    pub command_id: String,
    /// When the producer issued it, milliseconds since the Unix epoch.
    pub issued_at: i64,
    pub tenant: Option<String>,
    pub command: Command,
}

impl Envelope {
    /// Wraps `command` with a fresh id and the current time.
    pub fn new(command: Command) -> Self {
        let issued_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        Envelope { command_id: uuid::Uuid::new_v4().to_string(), issued_at, tenant: None, command }
    }
}

impl Command {
    /// Low-cardinality name of the command type (metrics label, logs).
    pub fn kind(&self) -> &'static str {
        match self {
            Command::UpsertFile { .. } => "upsert_file",
            Command::DeleteFile { .. } => "delete_file",
            Command::RenamePath { .. } => "rename",
            Command::UpsertUser { .. } => "upsert_user",
            Command::UpsertPost { .. } => "upsert_post",
            Command::DeletePost { .. } => "delete_post",
        }
    }

    /// True for commands that rewrite an unbounded number of documents.
    pub fn is_fan_out(&self) -> bool {
        matches!(self, Command::RenamePath { .. } | Command::UpsertUser { .. })
    }

    /// Checks every field. A command that passes can be keyed and applied.
    pub fn validate(&self) -> Result<(), CommandError> {
        match self {
            Command::UpsertFile { id, path, .. } | Command::DeleteFile { id, path } => {
                check_id("id", id)?;
                check_file_path(path)
            }
            Command::RenamePath { from, to } => {
                path::validate("from", from)?;
                path::validate("to", to)?;
                if path::is_within(to, from) {
                    return Err(CommandError::RenameIntoItself { from: from.clone(), to: to.clone() });
                }
                let cross = |reason| CommandError::CrossKey { from: from.clone(), to: to.clone(), reason };
                if path::depth(from) == 1 || path::depth(to) == 1 {
                    return Err(cross("renames a top-level directory"));
                }
                if path::top_level(from) != path::top_level(to) {
                    return Err(cross("different top-level directories"));
                }
                Ok(())
            }
            Command::UpsertUser { id, name, dob, .. } => {
                check_id("id", id)?;
                if name.trim().is_empty() {
                    return Err(CommandError::InvalidField { field: "name", reason: "is empty".into() });
                }
                check_date("dob", dob)
            }
            Command::UpsertPost { id, user_id, .. } | Command::DeletePost { id, user_id } => {
                check_id("id", id)?;
                check_id("user_id", user_id)
            }
        }
    }

    /// The ordering domain: the top-level directory for filesystem commands,
    /// the user id for user and post commands. Valid commands only.
    pub fn key(&self) -> &str {
        match self {
            Command::UpsertFile { path, .. } | Command::DeleteFile { path, .. } => path::top_level(path),
            Command::RenamePath { from, .. } => path::top_level(from),
            Command::UpsertUser { id, .. } => id,
            Command::UpsertPost { user_id, .. } | Command::DeletePost { user_id, .. } => user_id,
        }
    }
}

fn check_id(field: &'static str, id: &str) -> Result<(), CommandError> {
    let reason = if id.is_empty() {
        "is empty"
    } else if id.len() > MAX_ID_LEN {
        "is longer than 512 bytes"
    } else if id.chars().any(char::is_control) {
        "has a control character"
    } else {
        return Ok(());
    };
    Err(CommandError::InvalidField { field, reason: reason.into() })
}

fn check_file_path(p: &str) -> Result<(), CommandError> {
    path::validate("path", p)?;
    if path::depth(p) < 2 {
        return Err(CommandError::InvalidPath {
            field: "path",
            path: p.to_string(),
            reason: "must lie inside a top-level directory".into(),
        });
    }
    Ok(())
}

/// `YYYY-MM-DD` with a plausible month and day.
fn check_date(field: &'static str, s: &str) -> Result<(), CommandError> {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    let ok = b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && digits(0..4)
        && digits(5..7)
        && digits(8..10)
        && (1..=12).contains(&s[5..7].parse::<u32>().unwrap_or(0))
        && (1..=31).contains(&s[8..10].parse::<u32>().unwrap_or(0));
    if ok {
        Ok(())
    } else {
        Err(CommandError::InvalidField { field, reason: format!("{s:?} is not a YYYY-MM-DD date") })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rename(from: &str, to: &str) -> Command {
        Command::RenamePath { from: from.into(), to: to.into() }
    }

    #[test]
    fn keys_follow_the_ordering_domain() {
        let f = Command::UpsertFile { id: "f".into(), path: "/clinton/a/b.txt".into(), contents: String::new() };
        assert_eq!(f.key(), "/clinton");
        assert_eq!(rename("/clinton/projects", "/clinton/work").key(), "/clinton");
        let p = Command::UpsertPost { id: "p".into(), user_id: "7".into(), title: String::new(), body: String::new() };
        assert_eq!(p.key(), "7");
        let u = Command::UpsertUser { id: "7".into(), name: "J".into(), email: String::new(), dob: "1970-10-24".into() };
        assert_eq!(u.key(), "7");
    }

    #[test]
    fn rejects_renames_into_themselves() {
        assert!(matches!(rename("/a/b", "/a/b/c").validate(), Err(CommandError::RenameIntoItself { .. })));
        assert!(matches!(rename("/a/b", "/a/b").validate(), Err(CommandError::RenameIntoItself { .. })));
        assert!(rename("/a/b", "/a/bc").validate().is_ok());
    }

    #[test]
    fn rejects_cross_key_renames_for_now() {
        assert!(matches!(rename("/clinton/a", "/bill/a").validate(), Err(CommandError::CrossKey { .. })));
        assert!(matches!(rename("/clinton", "/bill").validate(), Err(CommandError::CrossKey { .. })));
        assert!(matches!(rename("/clinton/a", "/clinton").validate(), Err(CommandError::CrossKey { .. })));
    }

    #[test]
    fn rejects_files_outside_a_top_level_directory() {
        let f = Command::DeleteFile { id: "f".into(), path: "/readme.txt".into() };
        assert!(f.validate().is_err());
    }

    #[test]
    fn validates_ids_and_dates() {
        let u = |id: &str, dob: &str| Command::UpsertUser { id: id.into(), name: "n".into(), email: String::new(), dob: dob.into() };
        assert!(u("1", "1970-10-24").validate().is_ok());
        assert!(u("", "1970-10-24").validate().is_err());
        assert!(u("1", "1970-13-24").validate().is_err());
        assert!(u("1", "24.10.1970").validate().is_err());
        assert!(u(&"x".repeat(513), "1970-10-24").validate().is_err());
    }
}
