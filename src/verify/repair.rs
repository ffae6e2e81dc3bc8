//! `denorm verify --repair`: the commands that restore the documents a
//! verify found different, sent through the log like any command. No I/O.
//!
//! Each differing document gets one command under its own key, carrying
//! [`Repair`] with the offset the verify compared its partition at: an
//! upsert with the replay's version of the document, or the delete of a
//! document the replay does not have. The worker applies it in the key's
//! order, only if the document was not written since (see
//! `crate::apply::repair_refusal`); a replay of the log applies it the
//! same way. Within a key, files and posts come before the user: a post's
//! upsert takes its author's name from the user document, and the user's
//! upsert then renames the posts that do not carry its name; a declared
//! model's owners come after their dependents alike.

use std::collections::BTreeSet;

use serde::Serialize;

use super::compare::{Difference, Positions, Problem};
use crate::command::{Command, Envelope, Repair};
use crate::index::Doc;

/// A difference no command can repair, or not now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NotRepaired {
    pub kind: &'static str,
    pub id: String,
    pub reason: String,
}

/// A repair command sent, and where it landed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sent {
    pub kind: &'static str,
    pub id: String,
    pub key: String,
    pub command: &'static str,
    pub partition: i32,
    pub offset: i64,
}

/// What `--repair` did (in the report of the verify that found the
/// differences).
#[derive(Debug, Clone, Serialize)]
pub struct Repaired {
    pub sent: Vec<Sent>,
    pub not_repaired: Vec<NotRepaired>,
    /// Differences found beyond `--max-repairs`: counted, not repaired by
    /// this run (review F13: a repair holds at most that many).
    pub beyond_max_repairs: usize,
    /// The verify of the repaired keys once the live workers had applied
    /// the repairs (none when nothing was sent, or they were not applied
    /// in time).
    pub after: Option<Box<super::Report>>,
    /// Why the repairs sent could not be verified (the workers did not
    /// apply them in time): the verify exits 2 after printing this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Repaired {
    /// The differences left: those not repaired (and beyond
    /// `--max-repairs`), and the repairs sent whose document the verify
    /// after them still found different. That verify covers the repaired
    /// keys whole, so it also finds the differences of those keys not
    /// repaired: they are counted once. A difference it found beyond those
    /// it listed counts as a repair that did not take.
    pub fn left(&self) -> usize {
        let after = self.after.as_ref().map_or(0, |a| {
            let sent: std::collections::HashSet<(&str, &str)> = self.sent.iter().map(|s| (s.kind, s.id.as_str())).collect();
            let o = &a.outcome;
            o.differences.iter().filter(|d| sent.contains(&(d.kind, d.id.as_str()))).count() + (o.differences_total - o.differences.len())
        });
        self.not_repaired.len() + self.beyond_max_repairs + after
    }
}

/// The repairs of a verify's differences.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// In the order to send them.
    pub commands: Vec<Envelope>,
    pub not_repaired: Vec<NotRepaired>,
}

impl Plan {
    /// The keys the commands are sent under.
    pub fn keys(&self) -> BTreeSet<String> {
        self.commands.iter().map(|e| e.command.key().to_string()).collect()
    }
}

/// The command that turns `actual` into `expected` (one of them present).
fn command_for(expected: Option<&Doc>, actual: Option<&Doc>) -> Result<Command, &'static str> {
    Ok(match (expected, actual) {
        (Some(Doc::File(f)), _) => Command::UpsertFile { id: f.id.clone(), path: f.full_path(), contents: f.contents.clone(), previous_path: None },
        (Some(Doc::User(u)), _) => Command::UpsertUser { id: u.id.clone(), name: u.name.clone(), email: u.email.clone(), dob: u.dob.clone() },
        (Some(Doc::Post(p)), _) => Command::UpsertPost { id: p.id.clone(), user_id: p.user.id.clone(), title: p.title.clone(), body: p.body.clone(), previous_user_id: None },
        (None, Some(Doc::File(f))) => Command::DeleteFile { id: f.id.clone(), path: f.full_path() },
        (None, Some(Doc::Post(p))) => Command::DeletePost { id: p.id.clone(), user_id: p.user.id.clone() },
        (None, Some(Doc::User(u))) => Command::DeleteUser { id: u.id.clone() },
        (Some(Doc::Model(m)), _) => m.upsert().map_err(|_| NOT_A_COMMAND)?,
        (None, Some(Doc::Model(m))) => m.delete().map_err(|_| NOT_A_COMMAND)?,
        (None, None) => return Err("neither side has the document"),
    })
}

/// Why a model's document is not repaired by a command of its model.
const NOT_A_COMMAND: &str = "the document is not one a command of its model can write (a field the model does not declare, or one missing): `denorm rebuild` restores it";

/// Where a kind's repairs go within a key (see the module's comment): an
/// owner's upsert rewrites the copies of its dependents, so it comes
/// after theirs.
fn rank(c: &Command) -> u8 {
    match c {
        Command::UpsertUser { .. } => 1,
        Command::Model(b) => u8::from(b.dependent_kinds() > 0),
        _ => 0,
    }
}

/// The repairs of `differences`, found by a verify that compared the live
/// index at `at`. `moved` says whether a partition's live checkpoint moved
/// past `at` since: a document missing there may have been deleted by a
/// command since, which the guard cannot see where deletes leave no
/// position (the embedded index), so it is not repaired now.
pub fn plan(differences: &[Difference], at: &Positions, moved: &dyn Fn(i32) -> bool) -> Plan {
    let mut plan = Plan::default();
    for d in differences {
        let not = |reason: String| NotRepaired { kind: d.kind, id: d.id.clone(), reason };
        if let Some(other) = &d.elsewhere {
            let side = if d.problem == Problem::Missing { "the live index" } else { "the replay" };
            plan.not_repaired.push(not(format!(
                "{side} holds it under key {other}: a document that changed owners is not restored by a repair of one key (on Elasticsearch it would be refused as another partition's; the two halves land in different partitions in no order). Send its owner change (previous_path or previous_user_id, docs/cross-key.md), then verify again"
            )));
            continue;
        }
        if let Some(f) = d.fields.iter().find(|f| f.field == "denorm_partition") {
            plan.not_repaired.push(not(format!(
                "it records partition {} as its writer, not its key's partition {}: the workers refuse every command of it as an owner conflict, a repair included. `denorm rebuild` restores it",
                f.actual, d.partition
            )));
            continue;
        }
        if d.fields.iter().any(|f| f.field == "denorm_pos" && !f.actual.is_null()) {
            plan.not_repaired.push(not(format!(
                "its position (offset {}) is past the end of the log, written by no command: the workers' position guard refuses every command of it, a repair included. `denorm rebuild` restores it",
                d.live_offset.unwrap_or(0)
            )));
            continue;
        }
        if d.problem == Problem::Missing && moved(d.partition) {
            plan.not_repaired.push(not(format!("partition {} applied more commands since the verify: verify again", d.partition)));
            continue;
        }
        match command_for(d.expected.as_ref(), d.actual.as_ref()) {
            Ok(command) => {
                let mut e = Envelope::new(command);
                e.repair = Some(Repair { unchanged_since: at.get(&d.partition).copied().unwrap_or(-1), seen: Some(d.actual.is_some()) });
                plan.commands.push(e);
            }
            Err(reason) => plan.not_repaired.push(not(reason.to_string())),
        }
    }
    plan.commands.sort_by_cached_key(|e| (e.command.key().to_string(), rank(&e.command)));
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{Author, FileDoc, PostDoc, UserDoc};

    fn diff(problem: Problem, partition: i32, expected: Option<Doc>, actual: Option<Doc>) -> Difference {
        let doc = expected.as_ref().or(actual.as_ref()).unwrap();
        Difference {
            kind: doc.kind().as_str(),
            id: doc.id().to_string(),
            problem,
            partition,
            fields: Vec::new(),
            live_offset: actual.as_ref().map(Doc::pos),
            replay_offset: expected.as_ref().map(Doc::pos),
            elsewhere: None,
            expected,
            actual,
        }
    }

    fn user(name: &str) -> Doc {
        Doc::User(UserDoc { id: "u1".into(), name: name.into(), email: "u@x".into(), dob: "1970-01-01".into(), pos: 4 })
    }

    fn post(id: &str, name: &str) -> Doc {
        Doc::Post(PostDoc { id: id.into(), title: "t".into(), body: "b".into(), user: Author { id: "u1".into(), name: name.into() }, pos: 5 })
    }

    /// Review F10: the two halves of a moved document (live under `/z`,
    /// the replay under `/c`) are planned together: neither is sent, even
    /// where one half's partition has not moved (the delete alone left the
    /// document searchable nowhere).
    #[test]
    fn the_two_halves_of_a_moved_document_are_planned_together() {
        let live = vec![Doc::File(FileDoc::at("f", "/z/x.txt", "c", 3))];
        let replay = vec![Doc::File(FileDoc::at("f", "/c/x.txt", "c", 4))];
        let at: Positions = (0..4).map(|p| (p, 5)).collect();
        let differences = super::super::compare::compare(live, replay, &at, 4).settle(&|_| false, 10).differences;
        let c = crate::command::partitioner::partition_of("/c", 4);
        let plan = plan(&differences, &at, &|p| p == c);
        assert!(plan.commands.is_empty(), "{:?}", plan.commands);
        assert_eq!(plan.not_repaired.len(), 2);
        assert!(plan.not_repaired.iter().all(|n| n.id == "f" && n.reason.contains("changed owners")), "{:?}", plan.not_repaired);
    }

    /// Each difference becomes the command that restores the replay's
    /// version, under its key, marked with its partition's offset; a
    /// user's upsert follows its posts'; a user the replay lacks is
    /// deleted (schema version 7); a document missing in a partition that
    /// moved on is not repaired.
    #[test]
    fn each_difference_becomes_its_guarded_command() {
        let file = |c: &str| Doc::File(FileDoc::at("f1", "/a/x/f.txt", c, 7));
        let diffs = vec![
            diff(Problem::Differs, 1, Some(user("Ann")), Some(user("Bob"))),
            diff(Problem::Differs, 1, Some(post("p1", "Ann")), Some(post("p1", "Bob"))),
            diff(Problem::Differs, 0, Some(file("right")), Some(file("wrong"))),
            diff(Problem::Unexpected, 1, None, Some(post("p2", "Ann"))),
            diff(Problem::Missing, 2, Some(Doc::File(FileDoc::at("f2", "/b/g.txt", "lost", 3))), None),
            diff(Problem::Missing, 3, Some(Doc::File(FileDoc::at("f3", "/c/h.txt", "lost", 3))), None),
            diff(Problem::Unexpected, 1, None, Some(Doc::User(UserDoc { id: "u2".into(), name: "x".into(), email: "x@x".into(), dob: "1970-01-01".into(), pos: 1 }))),
        ];
        let at: Positions = [(0, 10), (1, 11), (2, 12), (3, 13)].into_iter().collect();
        let plan = plan(&diffs, &at, &|p| p == 3);
        let got: Vec<(String, &str, i64)> = plan.commands.iter().map(|e| (e.command.key().to_string(), e.command.kind(), e.repair.unwrap().unchanged_since)).collect();
        let want = [("/a", "upsert_file", 10), ("/b", "upsert_file", 12), ("u1", "upsert_post", 11), ("u1", "delete_post", 11), ("u1", "upsert_user", 11), ("u2", "delete_user", 11)];
        assert_eq!(got, want.iter().map(|(k, c, o)| (k.to_string(), *c, *o)).collect::<Vec<_>>());
        assert_eq!(plan.commands[0].command, Command::UpsertFile { id: "f1".into(), path: "/a/x/f.txt".into(), contents: "right".into(), previous_path: None });
        assert!(matches!(&plan.commands[4].command, Command::UpsertUser { name, .. } if name == "Ann"));
        let not: Vec<(&str, &str)> = plan.not_repaired.iter().map(|n| (n.id.as_str(), n.reason.as_str())).collect();
        assert_eq!(not, vec![("f3", "partition 3 applied more commands since the verify: verify again")]);
        assert_eq!(plan.keys().into_iter().collect::<Vec<_>>(), vec!["/a", "/b", "u1", "u2"]);
        for e in &plan.commands {
            assert!(crate::apply::repairable(&e.command), "{e:?}");
        }
    }
    /// Review F17: a document whose recorded writer is another partition
    /// is not sent a repair (the workers refuse it as an owner conflict);
    /// one whose position was lost is.
    #[test]
    fn a_wrong_writer_is_left_to_a_rebuild_and_a_lost_position_is_repaired() {
        use super::super::compare::{Field, Live};
        use crate::index::Recorded;
        let file = |id: &str| Doc::File(FileDoc::at(id, &format!("/a/{id}.txt"), "c", 3));
        let p = crate::command::partitioner::partition_of("/a", 4);
        let live = vec![Live(file("f1"), Recorded { owner: Some((p + 1) % 4), pos_lost: false }), Live(file("f2"), Recorded { owner: Some(p), pos_lost: true })];
        let at: Positions = (0..4).map(|p| (p, 5)).collect();
        let differences = super::super::compare::compare(live, vec![file("f1"), file("f2")], &at, 4).settle(&|_| false, 10).differences;
        let fields: Vec<&Field> = differences.iter().flat_map(|d| &d.fields).collect();
        assert_eq!(fields.len(), 2, "{differences:?}");
        let plan = plan(&differences, &at, &|_| false);
        assert!(matches!(&plan.commands[..], [e] if matches!(&e.command, Command::UpsertFile { id, .. } if id == "f2")), "{:?}", plan.commands);
        assert_eq!(plan.not_repaired.len(), 1);
        assert!(plan.not_repaired[0].id == "f1" && plan.not_repaired[0].reason.contains("denorm rebuild"), "{:?}", plan.not_repaired);
    }

    /// A declared model's documents: the replay's version upserted, a
    /// stray deleted under its key field's value, in their tenant; within
    /// a key the owner's upsert comes after its dependents'.
    #[test]
    fn a_models_documents_are_repaired_by_its_own_commands_owners_last() {
        use crate::command::generic::{Object, Op, Value};
        use crate::command::tenant;
        use crate::index::{ModelDoc, ModelKind};
        let d = crate::domain::tests::shop().interned();
        let fields = |pairs: &[(&str, &str)]| -> Object { pairs.iter().map(|(k, v)| (k.to_string(), Value::Str(v.to_string()))).collect() };
        let doc = |kind: &str, id: &str, f: Object| Doc::Model(Box::new(ModelDoc::new(ModelKind::of(d, kind).unwrap(), tenant::scope(Some("acme"), id), f, Default::default(), 3)));
        let customer = doc("customer", "c1", fields(&[("name", "Ann"), ("plan", "gold"), ("since", "2026-01-01")]));
        let mut ticket = fields(&[("customer_id", "c1"), ("subject", "Late")]);
        ticket.insert("open".into(), Value::Bool(true));
        let ticket = doc("ticket", "t1", ticket);
        let diffs =
            vec![diff(Problem::Differs, 1, Some(customer.clone()), Some(customer.clone())), diff(Problem::Unexpected, 1, None, Some(ticket.clone())), diff(Problem::Missing, 1, Some(ticket), None)];
        let at: Positions = (0..4).map(|p| (p, 5)).collect();
        let plan = plan(&diffs, &at, &|_| false);
        assert!(plan.not_repaired.is_empty(), "{:?}", plan.not_repaired);
        let got: Vec<(&str, &str, Option<&str>, &str)> = plan
            .commands
            .iter()
            .map(|e| {
                let Command::Model(b) = &e.command else { panic!("{e:?}") };
                assert!(crate::apply::repairable(&e.command), "{e:?}");
                let (id, at) = match &b.command.op {
                    Op::Upsert { id, .. } => (id.as_str(), None),
                    Op::Delete { id, at } => (id.as_str(), at.as_deref()),
                    other => panic!("{other:?}"),
                };
                (b.command.kind.as_str(), id, at, b.tenant.as_deref().unwrap())
            })
            .collect();
        assert_eq!(got, [("ticket", "t1", Some("c1"), "acme"), ("ticket", "t1", None, "acme"), ("customer", "c1", None, "acme")]);
        assert!(plan.commands.iter().all(|e| e.command.key() == tenant::scope(Some("acme"), "c1")));
    }
}
