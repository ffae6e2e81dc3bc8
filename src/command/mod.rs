//! The domain commands, their ordering keys and validation. No I/O.

pub mod control;
pub mod generic;
pub mod jsonl;
pub mod moves;
pub mod partitioner;
pub mod path;
pub mod tenant;

use serde::{Deserialize, Serialize};

/// Longest id accepted for a file, user or post, in bytes (Elasticsearch's
/// limit of `_id`).
pub const MAX_ID_LEN: usize = 512;
/// Longest path, user name or e-mail address accepted, in bytes. They are
/// indexed as single terms (keyword fields, `path.tree` tokens), which
/// Elasticsearch refuses past 32,766 bytes while tantivy would take them:
/// one limit, well below both, keeps the backends in agreement.
pub const MAX_TERM_LEN: usize = 4096;

/// Why a command is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("{field} {path:?} {reason}")]
    InvalidPath { field: &'static str, path: String, reason: String },
    #[error("{field} {reason}")]
    InvalidField { field: &'static str, reason: String },
    #[error("rename of {from:?} into itself ({to:?})")]
    RenameIntoItself { from: String, to: String },
    #[error("rename {from:?} -> {to:?}: {reason}")]
    TopLevel { from: String, to: String, reason: &'static str },
    #[error("tenant {tenant:?} {reason}")]
    InvalidTenant { tenant: String, reason: String },
    /// A declared model's command that its model refuses.
    #[error("{0}")]
    Model(generic::Invalid),
    /// A command whose identifiers name two tenants: a move or an owner
    /// change across tenants, which denorm refuses (see docs/tenants.md).
    #[error(
        "{field} belongs to tenant {other:?}, not to the command's tenant {tenant:?} (\"\": the default tenant): a document never moves between tenants; delete it in one and upsert it in the other"
    )]
    CrossTenant { field: &'static str, tenant: String, other: String },
}

/// One command of the log. The envelope travels with it in [`Envelope`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    UpsertFile {
        id: String,
        path: String,
        contents: String,
        /// Set when the file changes owner (moves to another top-level
        /// directory with this upsert): its current path. Such an upsert
        /// takes the file over from that directory's key (see
        /// [`Command::previous_key`] and [`expand_owner_changes`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        previous_path: Option<String>,
    },
    DeleteFile {
        id: String,
        path: String,
    },
    #[serde(rename = "rename")]
    RenamePath {
        from: String,
        to: String,
    },
    UpsertUser {
        id: String,
        name: String,
        email: String,
        dob: String,
    },
    UpsertPost {
        id: String,
        user_id: String,
        title: String,
        body: String,
        /// Set when the post changes owner: the user it belonged to. Such an
        /// upsert takes the post over from that user's key (see
        /// [`Command::previous_key`] and [`expand_owner_changes`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        previous_user_id: Option<String>,
    },
    DeletePost {
        id: String,
        user_id: String,
    },
    /// Deletes a user's profile document (schema version 7); the user's
    /// posts stay unless deleted on their own (`denorm tenant delete`
    /// sends their deletes first).
    DeleteUser {
        id: String,
    },
    /// A declared model's command (docs/model.md): written and read by
    /// the model's codec, never by this enum's serde form.
    #[serde(skip)]
    Model(Box<generic::bound::Bound>),
}

/// A command with its envelope: the unit written to the topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// UUID of this command, chosen by the producer.
    pub command_id: String,
    /// When the producer issued it, milliseconds since the Unix epoch.
    pub issued_at: i64,
    pub tenant: Option<String>,
    /// Where in the log the command this one must follow is: set on the
    /// upsert of an owner change, to its delete half under the key the
    /// document leaves (see `Producer::send_ordered`). A worker applies the
    /// upsert only once that partition's shard has applied everything
    /// before it, so a replay takes the document over in the order it
    /// changed owners (see docs/cross-key.md).
    pub after: Option<LogPosition>,
    /// Set on a repair sent by `denorm verify --repair` (see [`Repair`]).
    pub repair: Option<Repair>,
    pub command: Command,
}

/// A repair: the command restores one document to its state in the
/// replay of the log, unless the document was written since the verify
/// compared it (see `crate::apply::repair_refusal` and docs/verify.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repair {
    /// The offset, in the partition of the command's key, the verify
    /// compared the live index at.
    pub unchanged_since: i64,
    /// Whether the verify found the document in the live index (`None`:
    /// a repair of schema version 5, which did not say).
    pub seen: Option<bool>,
}

/// A message's place in the command topic: where a command landed. Wait
/// until the worker group's committed offset of `partition` passes `offset`
/// to read your own write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct LogPosition {
    pub partition: i32,
    pub offset: i64,
}

impl Envelope {
    /// Wraps `command` with a fresh id and the current time, in the tenant
    /// it is scoped to (see [`tenant`]).
    pub fn new(command: Command) -> Self {
        let issued_at = crate::clock::now_millis();
        let tenant = command.tenant().map(str::to_string);
        Envelope { command_id: uuid::Uuid::new_v4().to_string(), issued_at, tenant, after: None, repair: None, command }
    }

    /// The envelope of `tenant` (`None`: the default tenant), its command
    /// (as its producer wrote it) scoped to it: how envelopes are held
    /// (see [`tenant`]).
    pub fn of_tenant(mut self, tenant: Option<&str>) -> Self {
        self.command = self.command.unscoped().scoped(tenant);
        self.tenant = tenant.map(str::to_string);
        self
    }

    /// Checks the tenant and the command: what a worker admits.
    pub fn validate(&self) -> Result<(), CommandError> {
        match &self.tenant {
            // Unscoped: a control character (such as a scope's separator)
            // is refused.
            None => self.command.validate(),
            Some(t) => {
                tenant::validate(t)?;
                if self.command.tenant() != Some(t.as_str()) {
                    return Err(CommandError::InvalidTenant { tenant: t.clone(), reason: "is not the tenant its command is scoped to".into() });
                }
                self.command.validate_scoped()
            }
        }
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
            Command::DeleteUser { .. } => "delete_user",
            Command::Model(b) => b.command.op.name(),
        }
    }

    /// For a rename whose `to` lies under another top-level directory than
    /// its `from` (another ordering key): the destination key. Such a
    /// rename is applied through the move protocol (see [`crate::moves`]).
    pub fn destination_key(&self) -> Option<&str> {
        match self {
            Command::RenamePath { from, to } if path::top_level(from) != path::top_level(to) => Some(path::top_level(to)),
            _ => None,
        }
    }

    /// For an upsert that gives its document another owner (a file's
    /// `previous_path` under another top-level directory, a post's
    /// `previous_user_id` other than its `user_id`): the key the document
    /// leaves. Its copy there is deleted first ([`expand_owner_changes`]),
    /// and the upsert takes the document over wherever backends share
    /// documents. Valid commands only.
    pub fn previous_key(&self) -> Option<&str> {
        match self {
            Command::UpsertFile { path, previous_path: Some(p), .. } if path::top_level(p) != path::top_level(path) => Some(path::top_level(p)),
            Command::UpsertPost { user_id, previous_user_id: Some(p), .. } if p != user_id => Some(p),
            Command::Model(b) => b.previous_key(),
            _ => None,
        }
    }

    /// For an owner change ([`Command::previous_key`]): its first half, the
    /// delete of the document under the key it leaves.
    pub fn owner_change_delete(&self) -> Option<Command> {
        self.previous_key()?;
        match self {
            Command::UpsertFile { id, previous_path: Some(p), .. } => Some(Command::DeleteFile { id: id.clone(), path: p.clone() }),
            Command::UpsertPost { id, previous_user_id: Some(u), .. } => Some(Command::DeletePost { id: id.clone(), user_id: u.clone() }),
            Command::Model(b) => b.owner_change_delete().map(|d| Command::Model(Box::new(d))),
            _ => None,
        }
    }

    /// True for commands that rewrite an unbounded number of documents.
    pub fn is_fan_out(&self) -> bool {
        match self {
            Command::Model(b) => b.is_fan_out(),
            _ => matches!(self, Command::RenamePath { .. } | Command::UpsertUser { .. }),
        }
    }

    /// Checks every field. A command that passes can be keyed and applied.
    pub fn validate(&self) -> Result<(), CommandError> {
        match self {
            Command::UpsertFile { id, path, previous_path, .. } => {
                check_id("id", id)?;
                check_file_path("path", path)?;
                previous_path.as_deref().map_or(Ok(()), |p| check_file_path("previous_path", p))
            }
            Command::DeleteFile { id, path } => {
                check_id("id", id)?;
                check_file_path("path", path)
            }
            Command::RenamePath { from, to } => {
                path::validate("from", from)?;
                path::validate("to", to)?;
                if path::is_within(to, from) {
                    return Err(CommandError::RenameIntoItself { from: from.clone(), to: to.clone() });
                }
                // A top-level directory is renamed to a top-level directory,
                // and anything deeper stays deeper: a file never ends up
                // directly below `/`, where no file may be.
                let top = |reason| CommandError::TopLevel { from: from.clone(), to: to.clone(), reason };
                match (path::depth(from) == 1, path::depth(to) == 1) {
                    (true, false) => Err(top("a top-level directory can only be renamed to a top-level directory")),
                    (false, true) => Err(top("only a top-level directory can become one; move it beneath one instead")),
                    _ => Ok(()),
                }
            }
            Command::UpsertUser { id, name, email, dob } => {
                check_id("id", id)?;
                if name.trim().is_empty() {
                    return Err(CommandError::InvalidField { field: "name", reason: "is empty".into() });
                }
                check_term("name", name)?;
                check_term("email", email)?;
                check_date("dob", dob)
            }
            Command::UpsertPost { id, user_id, previous_user_id, .. } => {
                check_id("id", id)?;
                check_id("user_id", user_id)?;
                previous_user_id.as_deref().map_or(Ok(()), |p| check_id("previous_user_id", p))
            }
            Command::DeletePost { id, user_id } => {
                check_id("id", id)?;
                check_id("user_id", user_id)
            }
            Command::DeleteUser { id } => check_id("id", id),
            Command::Model(b) => b.validate().map_err(CommandError::Model),
        }
    }

    /// The ordering domain: the top-level directory for filesystem commands,
    /// the user id for user and post commands, scoped to the command's
    /// tenant (see [`tenant`]). Valid commands only.
    pub fn key(&self) -> &str {
        match self {
            Command::UpsertFile { path, .. } | Command::DeleteFile { path, .. } => path::top_level(path),
            Command::RenamePath { from, .. } => path::top_level(from),
            Command::UpsertUser { id, .. } | Command::DeleteUser { id } => id,
            Command::UpsertPost { user_id, .. } | Command::DeletePost { user_id, .. } => user_id,
            Command::Model(b) => b.key(),
        }
    }
}

/// Puts, before every upsert that gives its document another owner
/// ([`Command::previous_key`]), the delete of the document under the key it
/// leaves: the two halves of an owner change, each keyed by its own key. A
/// producer sends the upsert once the delete is applied (see
/// `Producer::send_ordered`).
pub fn expand_owner_changes(commands: Vec<Command>) -> Vec<Command> {
    let mut out = Vec::with_capacity(commands.len());
    for c in commands {
        if let Some(delete) = c.owner_change_delete() {
            // Already expanded: once is enough.
            if out.last() != Some(&delete) {
                out.push(delete);
            }
        }
        out.push(c);
    }
    out
}

fn check_id(field: &'static str, id: &str) -> Result<(), CommandError> {
    match id_problem(id) {
        None => Ok(()),
        Some(reason) => Err(CommandError::InvalidField { field, reason: reason.into() }),
    }
}

/// What makes `id` unfit to name a document, if anything.
pub(crate) fn id_problem(id: &str) -> Option<&'static str> {
    if id.is_empty() {
        Some("is empty")
    } else if id.len() > MAX_ID_LEN {
        Some("is longer than 512 bytes")
    } else if id.chars().any(char::is_control) {
        Some("has a control character")
    } else if id == "." || id == ".." {
        // An id is a path segment of Elasticsearch's document URLs, which
        // resolve these.
        Some("is '.' or '..'")
    } else {
        None
    }
}

fn check_file_path(field: &'static str, p: &str) -> Result<(), CommandError> {
    path::validate(field, p)?;
    if path::depth(p) < 2 {
        return Err(CommandError::InvalidPath { field, path: p.to_string(), reason: "must lie inside a top-level directory".into() });
    }
    Ok(())
}

fn check_term(field: &'static str, s: &str) -> Result<(), CommandError> {
    if s.len() > MAX_TERM_LEN {
        return Err(CommandError::InvalidField { field, reason: format!("is {} bytes, longer than {MAX_TERM_LEN}", s.len()) });
    }
    Ok(())
}

fn check_date(field: &'static str, s: &str) -> Result<(), CommandError> {
    match date_problem(s) {
        None => Ok(()),
        Some(why) => Err(CommandError::InvalidField { field, reason: format!("{s:?} {why}") }),
    }
}

/// What keeps `s` from being a date of the proleptic Gregorian calendar as
/// `YYYY-MM-DD`, years 0001 to 9999 (Elasticsearch's `yyyy-MM-dd` counts
/// years of the era: there is no year 0000), if anything.
pub(crate) fn date_problem(s: &str) -> Option<&'static str> {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    let shaped = b.len() == 10 && b[4] == b'-' && b[7] == b'-' && digits(0..4) && digits(5..7) && digits(8..10);
    if !shaped {
        return Some("is not a YYYY-MM-DD date");
    }
    let num = |r: std::ops::Range<usize>| s[r].parse::<u32>().expect("digits");
    let (y, m, d) = (num(0..4), num(5..7), num(8..10));
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return Some("has no such month"),
    };
    if y == 0 {
        return Some("is in year 0000, which the calendar does not have");
    }
    if d == 0 || d > days {
        return Some("is not a day of the calendar");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rename(from: &str, to: &str) -> Command {
        Command::RenamePath { from: from.into(), to: to.into() }
    }

    #[test]
    fn keys_follow_the_ordering_domain() {
        let f = Command::UpsertFile { id: "f".into(), path: "/clinton/a/b.txt".into(), contents: String::new(), previous_path: None };
        assert_eq!(f.key(), "/clinton");
        assert_eq!(rename("/clinton/projects", "/clinton/work").key(), "/clinton");
        let p = Command::UpsertPost { id: "p".into(), user_id: "7".into(), title: String::new(), body: String::new(), previous_user_id: None };
        assert_eq!(p.key(), "7");
        assert_eq!(p.previous_key(), None);
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
    fn accepts_cross_key_renames_that_keep_files_below_a_top_level_directory() {
        assert_eq!(rename("/clinton/a", "/bill/a").validate(), Ok(()));
        assert_eq!(rename("/clinton", "/bill").validate(), Ok(()));
        assert_eq!(rename("/clinton/a.txt", "/bill/b/a.txt").validate(), Ok(()));
        assert_eq!(rename("/clinton/a", "/bill/a").destination_key(), Some("/bill"));
        assert_eq!(rename("/clinton", "/bill").key(), "/clinton");
        assert_eq!(rename("/clinton/a", "/clinton/b").destination_key(), None);
        assert!(matches!(rename("/clinton/a", "/clinton").validate(), Err(CommandError::TopLevel { .. })));
        assert!(matches!(rename("/clinton/a", "/bill").validate(), Err(CommandError::TopLevel { .. })));
        assert!(matches!(rename("/clinton", "/bill/c").validate(), Err(CommandError::TopLevel { .. })));
    }

    #[test]
    fn an_owner_change_of_a_post_is_its_delete_under_the_old_user_then_the_upsert() {
        let post = |prev: Option<&str>| Command::UpsertPost { id: "p".into(), user_id: "7".into(), title: "t".into(), body: "b".into(), previous_user_id: prev.map(Into::into) };
        assert_eq!(post(Some("3")).key(), "7");
        assert_eq!(post(Some("3")).previous_key(), Some("3"));
        // Naming its own user is no owner change.
        assert_eq!(post(Some("7")).previous_key(), None);
        let out = expand_owner_changes(vec![post(Some("3")), post(Some("7")), post(None)]);
        assert_eq!(out, vec![Command::DeletePost { id: "p".into(), user_id: "3".into() }, post(Some("3")), post(Some("7")), post(None)]);
        assert_eq!(expand_owner_changes(out.clone()), out, "expanding twice changes nothing");
        assert!(post(Some("")).validate().is_err());
    }

    #[test]
    fn an_owner_change_of_a_file_is_its_delete_under_the_old_directory_then_the_upsert() {
        let up = |prev: Option<&str>| Command::UpsertFile { id: "f".into(), path: "/bill/b.txt".into(), contents: "c".into(), previous_path: prev.map(Into::into) };
        assert_eq!(up(Some("/clinton/a.txt")).previous_key(), Some("/clinton"));
        assert_eq!(up(Some("/clinton/a.txt")).key(), "/bill");
        // Within the same top-level directory it is an ordinary upsert.
        assert_eq!(up(Some("/bill/a.txt")).previous_key(), None);
        assert_eq!(up(Some("/bill/a.txt")).owner_change_delete(), None);
        assert_eq!(expand_owner_changes(vec![up(Some("/clinton/a.txt"))]), vec![Command::DeleteFile { id: "f".into(), path: "/clinton/a.txt".into() }, up(Some("/clinton/a.txt"))]);
        assert!(up(Some("/a.txt")).validate().is_err());
        assert!(up(Some("relative/a.txt")).validate().is_err());
        assert!(up(Some("/clinton/a.txt")).validate().is_ok());
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

    #[test]
    fn dates_must_exist_in_the_calendar() {
        let u = |dob: &str| Command::UpsertUser { id: "1".into(), name: "n".into(), email: String::new(), dob: dob.into() }.validate();
        for ok in ["2024-02-29", "2000-02-29", "2023-02-28", "0001-01-01", "9999-12-31", "1970-04-30"] {
            assert!(u(ok).is_ok(), "{ok} refused");
        }
        for bad in ["2023-02-31", "2023-02-29", "1900-02-29", "2023-04-31", "2023-00-10", "2023-01-00", "0000-01-01", "2023-1-01", "2023-01-01T00"] {
            assert!(u(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn terms_longer_than_the_limit_are_refused() {
        let long = format!("/a/{}", "x".repeat(MAX_TERM_LEN));
        assert!(Command::UpsertFile { id: "f".into(), path: long.clone(), contents: String::new(), previous_path: None }.validate().is_err());
        assert!(rename("/a/b", &long).validate().is_err());
        let user = |name: String, email: String| Command::UpsertUser { id: "1".into(), name, email, dob: "1970-01-01".into() }.validate();
        assert!(user("x".repeat(MAX_TERM_LEN + 1), String::new()).is_err());
        assert!(user("n".into(), "e".repeat(MAX_TERM_LEN + 1)).is_err());
        assert!(user("x".repeat(MAX_TERM_LEN), "e".repeat(MAX_TERM_LEN)).is_ok());
    }

    /// Each ancestor of a file is a term of it: a path's depth is bounded.
    #[test]
    fn paths_deeper_than_the_limit_are_refused() {
        let file = |path: String| Command::UpsertFile { id: "f".into(), path, contents: String::new(), previous_path: None }.validate();
        let deepest = format!("{}/f", "/a".repeat(path::MAX_DEPTH - 1));
        assert_eq!(path::depth(&deepest), path::MAX_DEPTH);
        assert!(file(deepest.clone()).is_ok());
        let e = file(format!("/a{deepest}")).unwrap_err().to_string();
        assert!(e.contains("more than 256 segments"), "{e}");
        assert!(file(format!("{}/f", "/a".repeat(2000))).is_err(), "2,001 segments in 4,002 bytes");
        assert!(rename("/a/b", &format!("/a{deepest}")).validate().is_err());
    }

    /// Document ids are path segments of Elasticsearch's URLs: `.` and `..`
    /// would address the index itself.
    #[test]
    fn ids_that_urls_resolve_are_refused() {
        for id in [".", ".."] {
            let e = Command::UpsertFile { id: id.into(), path: "/a/b".into(), contents: String::new(), previous_path: None }.validate().unwrap_err().to_string();
            assert!(e.contains("'.' or '..'"), "{id}: {e}");
            assert!(Command::UpsertUser { id: id.into(), name: "n".into(), email: String::new(), dob: "1970-01-01".into() }.validate().is_err());
            assert!(Command::DeletePost { id: id.into(), user_id: "u".into() }.validate().is_err());
        }
        for id in ["...", ".a", "a.", "a..b"] {
            assert!(Command::UpsertFile { id: id.into(), path: "/a/b".into(), contents: String::new(), previous_path: None }.validate().is_ok(), "{id}");
        }
    }
}
