//! The guard of a repair (a command sent by `denorm verify --repair`, see
//! [`crate::command::Repair`]): it restores one document to its state in
//! the replay of the log, and changes nothing if that document was written
//! after the offset the verify compared it at.
//!
//! The guard reads only what both backends hold alike, the document if
//! present and the offset that last wrote it, so that a replay decides a
//! repair as the live run did (the verify of a repaired index replays its
//! repairs too). A delete leaves no position on the embedded index, so a
//! document deleted after the verify's snapshot reads as absent: the
//! verify sends the repair of a missing document only for a partition
//! that has not moved since its snapshot (docs/verify.md).

use std::borrow::Cow;

use crate::command::generic::Op;
use crate::command::{tenant, Command, Repair};
use crate::index::{IndexError, Kind, ModelKind, Shard};

/// The one document an upsert or delete writes: its kind and id, scoped to
/// its tenant (none for a rename, a patch).
pub fn document(cmd: &Command) -> Option<(Kind, Cow<'_, str>)> {
    match cmd {
        Command::UpsertFile { id, .. } | Command::DeleteFile { id, .. } => Some((Kind::File, Cow::Borrowed(id))),
        Command::UpsertUser { id, .. } | Command::DeleteUser { id } => Some((Kind::User, Cow::Borrowed(id))),
        Command::UpsertPost { id, .. } | Command::DeletePost { id, .. } => Some((Kind::Post, Cow::Borrowed(id))),
        Command::Model(b) => match &b.command.op {
            Op::Upsert { id, .. } | Op::Delete { id, .. } => Some((Kind::Model(ModelKind::of(b.domain, &b.command.kind)?), Cow::Owned(tenant::scope(b.tenant.as_deref(), id)))),
            Op::Patch { .. } | Op::RenamePrefix { .. } => None,
        },
        // Not repaired (`repairable`).
        Command::RenamePath { .. } => None,
    }
}

/// Whether `cmd` deletes its document.
fn deletes(cmd: &Command) -> bool {
    match cmd {
        Command::DeleteFile { .. } | Command::DeletePost { .. } | Command::DeleteUser { .. } => true,
        Command::Model(b) => matches!(b.command.op, Op::Delete { .. }),
        _ => false,
    }
}

/// Whether a repair may carry `cmd`: an upsert or delete of one document,
/// not an owner change.
pub fn repairable(cmd: &Command) -> bool {
    cmd.previous_key().is_none() && document(cmd).is_some()
}

/// What the guard of a repair decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepairGuard {
    /// The document is as the verify saw it: apply the repair.
    Apply,
    /// A later command of this partition wrote the document already: this
    /// repair is a redelivery after a crash (Elasticsearch's writes outlive
    /// the checkpoint that would have skipped it), or the document's new
    /// owner's write came first. Either way the position guard skips it as
    /// it skips any stale command, and there is nothing to refuse (review
    /// of verify, S7: such a redelivery was dead-lettered as refused,
    /// although the repair had been applied).
    Superseded,
    /// The document changed since the verify compared it: not applied,
    /// with the reason.
    Refuse(String),
}

/// How to treat the repair `cmd` at log position `pos`, made from a verify
/// that compared the index at offset `repair.unchanged_since` and found the
/// document present or absent (`repair.seen`). It must not be applied if
/// the document changed since in either direction (review of verify, F2):
/// written after that offset by something other than this repair (a
/// redelivery of the repair passes; its writes are position-guarded like
/// any command's); or present and gone since (an upsert would bring it
/// back); or absent and here since. A delete of a document that is gone
/// changes nothing and passes. A repair of schema version 5 (`seen`
/// unknown) is judged by its offset only.
pub fn repair_guard<S: Shard + ?Sized>(shard: &mut S, cmd: &Command, repair: Repair, pos: u64) -> Result<RepairGuard, IndexError> {
    let Some((kind, id)) = document(cmd) else {
        return Ok(RepairGuard::Refuse(format!("a repair cannot carry a {}", cmd.kind())));
    };
    let since = repair.unchanged_since;
    let what = kind.as_str();
    // The position of the document, or of the tombstone its delete left
    // (Elasticsearch); another partition's document reads as newer than
    // anything here.
    let at = shard.position(kind, &id)?;
    if matches!(at, Some(at) if at > pos && at != u64::MAX) {
        return Ok(RepairGuard::Superseded);
    }
    if shard.get(kind, &id)?.is_none() {
        let upsert = !deletes(cmd);
        return Ok(if upsert && repair.seen == Some(true) {
            RepairGuard::Refuse(format!("{what} {id:?} was deleted after the verify found it at offset {since} or before: the repair would bring it back, and is not applied (verify again)"))
        } else {
            RepairGuard::Apply
        });
    }
    Ok(match at {
        Some(at) if at == pos => RepairGuard::Apply,
        Some(at) if at as i64 > since => RepairGuard::Refuse(format!(
            "{what} {id:?} was written at offset {} after the verify compared it at offset {since}: the repair is not applied (verify again)",
            if at == u64::MAX { "(another partition's)".to_string() } else { at.to_string() },
        )),
        _ if repair.seen == Some(false) => RepairGuard::Refuse(format!("{what} {id:?} is present, and the verify found it absent at offset {since}: the repair is not applied (verify again)")),
        _ => RepairGuard::Apply,
    })
}

impl RepairGuard {
    /// The reason it refuses, if it does.
    pub fn refusal(&self) -> Option<&str> {
        match self {
            RepairGuard::Refuse(why) => Some(why),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::{apply, FanOut};
    use crate::index::embedded::EmbeddedIndex;
    use crate::index::Doc;

    fn seen(unchanged_since: i64, seen: bool) -> Repair {
        Repair { unchanged_since, seen: Some(seen) }
    }

    fn upsert(contents: &str) -> Command {
        Command::UpsertFile { id: "f".into(), path: "/c/f.txt".into(), contents: contents.into(), previous_path: None }
    }

    /// A repair of a document unchanged since the verify applies, and a
    /// redelivery of it too; one of a document written since is refused,
    /// and so is one of a document deleted and written again since.
    #[test]
    fn a_repair_applies_only_to_a_document_unchanged_since_the_verify() {
        let dir = tempfile::tempdir().unwrap();
        let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
        let mut shard = idx.open_shard(0, 20_000_000).unwrap();
        let fan = FanOut::pages_of(10);
        apply(&mut shard, &upsert("v1"), 3, fan).unwrap();
        // The verify compared at offset 5; a repair at 8.
        assert_eq!(repair_guard(&mut shard, &upsert("right"), seen(5, true), 8).unwrap(), RepairGuard::Apply);
        apply(&mut shard, &upsert("right"), 8, fan).unwrap();
        // Its redelivery passes the guard (and writes nothing).
        assert_eq!(repair_guard(&mut shard, &upsert("right"), seen(5, true), 8).unwrap(), RepairGuard::Apply);
        assert_eq!(apply(&mut shard, &upsert("right"), 8, fan).unwrap(), 0);
        // Another repair from the same verify, after it: refused.
        let refused = repair_guard(&mut shard, &upsert("other"), seen(5, true), 9).unwrap().refusal().expect("refused").to_string();
        assert!(refused.contains("written at offset 8 after the verify compared it at offset 5"), "{refused}");
        // Absent (never written, or deleted): applied, a delete as well.
        let gone = Command::DeleteFile { id: "g".into(), path: "/c/g.txt".into() };
        assert_eq!(repair_guard(&mut shard, &gone, seen(5, true), 10).unwrap(), RepairGuard::Apply);
        apply(&mut shard, &Command::DeleteFile { id: "f".into(), path: "/c/f.txt".into() }, 11, fan).unwrap();
        apply(&mut shard, &upsert("again"), 12, fan).unwrap();
        assert!(repair_guard(&mut shard, &upsert("v1"), seen(5, true), 13).unwrap().refusal().is_some());
        match shard.get(Kind::File, "f").unwrap() {
            Some(Doc::File(f)) => assert_eq!((f.contents.as_str(), f.pos), ("again", 12)),
            other => panic!("{other:?}"),
        }
    }

    /// Review F2: the verify compared at 5 and found the document present
    /// (it differed); a producer deleted it at 6. The upsert repair at 8
    /// would bring it back: refused. A repair of a document the verify
    /// found absent is refused once one is present; a version-5 repair
    /// (`seen` unknown) keeps the offset rule alone.
    #[test]
    fn a_repair_never_brings_back_a_document_deleted_since_nor_overwrites_one_written_since() {
        let dir = tempfile::tempdir().unwrap();
        let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
        let mut shard = idx.open_shard(0, 20_000_000).unwrap();
        let fan = FanOut::pages_of(10);
        apply(&mut shard, &upsert("v1"), 3, fan).unwrap();
        apply(&mut shard, &Command::DeleteFile { id: "f".into(), path: "/c/f.txt".into() }, 6, fan).unwrap();
        let refused = repair_guard(&mut shard, &upsert("right"), seen(5, true), 8).unwrap().refusal().expect("refused").to_string();
        assert!(refused.contains("was deleted after the verify found it"), "{refused}");
        // The delete repair of a document gone since changes nothing.
        assert_eq!(repair_guard(&mut shard, &Command::DeleteFile { id: "f".into(), path: "/c/f.txt".into() }, seen(5, true), 9).unwrap(), RepairGuard::Apply);
        // Missing at the verify, still absent: applied; present at an
        // offset at or before the verify's: refused.
        assert_eq!(repair_guard(&mut shard, &upsert("lost"), seen(5, false), 10).unwrap(), RepairGuard::Apply);
        apply(&mut shard, &Command::UpsertFile { id: "h".into(), path: "/c/h.txt".into(), contents: "x".into(), previous_path: None }, 4, fan).unwrap();
        let h = Command::UpsertFile { id: "h".into(), path: "/c/h.txt".into(), contents: "y".into(), previous_path: None };
        assert!(repair_guard(&mut shard, &h, seen(5, false), 11).unwrap().refusal().is_some());
        let v5 = Repair { unchanged_since: 5, seen: None };
        assert_eq!(repair_guard(&mut shard, &upsert("right"), v5, 12).unwrap(), RepairGuard::Apply, "version 5: offsets only");
        assert_eq!(repair_guard(&mut shard, &h, v5, 12).unwrap(), RepairGuard::Apply);
    }

    /// Review S7: a repair applied, then a producer's write of the same
    /// document, then a crash before the checkpoint (Elasticsearch keeps
    /// both writes): the repair's redelivery is superseded, not refused,
    /// and the position guard skips it. A write between the verify and
    /// the repair is still a refusal. (The same on Elasticsearch, with a
    /// later delete too: `elastic_contracts::writes`.)
    #[test]
    fn a_repair_redelivered_after_a_later_write_is_superseded_not_refused() {
        let dir = tempfile::tempdir().unwrap();
        let idx = EmbeddedIndex::open(dir.path(), "t").unwrap();
        let mut shard = idx.open_shard(0, 20_000_000).unwrap();
        let fan = FanOut::pages_of(10);
        apply(&mut shard, &upsert("v1"), 3, fan).unwrap();
        apply(&mut shard, &upsert("right"), 8, fan).unwrap();
        apply(&mut shard, &upsert("later"), 9, fan).unwrap();
        assert_eq!(repair_guard(&mut shard, &upsert("right"), seen(5, true), 8).unwrap(), RepairGuard::Superseded);
        assert_eq!(apply(&mut shard, &upsert("right"), 8, fan).unwrap(), 0, "the position guard skips it");
        match shard.get(Kind::File, "f").unwrap() {
            Some(Doc::File(f)) => assert_eq!((f.contents.as_str(), f.pos), ("later", 9)),
            other => panic!("{other:?}"),
        }
        // A write before the repair's offset and after the verify's is
        // still a refusal.
        assert!(repair_guard(&mut shard, &upsert("x"), seen(5, true), 10).unwrap().refusal().is_some());
    }

    #[test]
    fn a_repair_carries_one_document_and_no_owner_change() {
        assert!(repairable(&upsert("x")));
        assert!(repairable(&Command::DeletePost { id: "p".into(), user_id: "u".into() }));
        assert!(repairable(&Command::UpsertUser { id: "u".into(), name: "n".into(), email: "e@x".into(), dob: "1970-01-01".into() }));
        assert!(!repairable(&Command::RenamePath { from: "/c/a".into(), to: "/c/b".into() }));
        let owner_change = Command::UpsertFile { id: "f".into(), path: "/b/f.txt".into(), contents: "x".into(), previous_path: Some("/c/f.txt".into()) };
        assert!(!repairable(&owner_change));
    }
}
