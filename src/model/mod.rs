//! Reference model: the plainest possible implementation of the command
//! semantics, independent of `apply/` and of any index. The demo and the
//! tests compare the real index against it.

pub mod generic;

use std::collections::BTreeMap;

use crate::command::{path, Command};
use crate::index::{Author, Doc, FileDoc, Kind, PostDoc, UserDoc};

/// A file a cross-key move carries: (id, new path, contents).
pub type MovedFile = (String, String, String);

#[derive(Debug, Default, Clone)]
pub struct Model {
    /// file id -> (full path, contents)
    files: BTreeMap<String, (String, String)>,
    users: BTreeMap<String, UserDoc>,
    /// post id -> (user id, copied author name, title, body)
    posts: BTreeMap<String, (String, String, String, String)>,
    /// A declared model's documents, when the log carries its commands.
    generic: Option<generic::ModelReference>,
}

impl Model {
    /// A model of a log that carries `domain`'s commands too.
    pub fn with_domain(domain: &crate::domain::Domain) -> Self {
        Model { generic: Some(generic::ModelReference::new(domain.clone())), ..Model::default() }
    }

    /// The declared model's documents ([`Model::with_domain`]).
    pub fn generic(&self) -> Option<&generic::ModelReference> {
        self.generic.as_ref()
    }

    pub fn apply(&mut self, c: &Command) {
        match c {
            Command::UpsertFile { id, path, contents, .. } => {
                self.files.insert(id.clone(), (path.clone(), contents.clone()));
            }
            Command::DeleteFile { id, .. } => {
                self.files.remove(id);
            }
            Command::RenamePath { from, to } => {
                for (full, _) in self.files.values_mut() {
                    if let Some(new) = path::renamed(full, from, to) {
                        *full = new;
                    }
                }
            }
            Command::UpsertUser { id, name, email, dob } => {
                let u = UserDoc { id: id.clone(), name: name.clone(), email: email.clone(), dob: dob.clone(), pos: 0 };
                self.users.insert(id.clone(), u);
                for (uid, author, _, _) in self.posts.values_mut() {
                    if uid == id {
                        *author = name.clone();
                    }
                }
            }
            // An owner change is the same upsert here: the model has one
            // copy of each document, whatever its key.
            Command::UpsertPost { id, user_id, title, body, .. } => {
                let author = self.users.get(user_id).map(|u| u.name.clone()).unwrap_or_default();
                self.posts.insert(id.clone(), (user_id.clone(), author, title.clone(), body.clone()));
            }
            Command::DeletePost { id, .. } => {
                self.posts.remove(id);
            }
            // The profile only: the user's posts keep their copy of the name.
            Command::DeleteUser { id } => {
                self.users.remove(id);
            }
            // A declared model's meaning is `generic::ModelReference`'s.
            Command::Model(b) => {
                if let Some(g) = &mut self.generic {
                    g.apply_command(&b.tenant, &b.command);
                }
            }
        }
    }

    /// The source half of a rename across top-level directories, as the
    /// move protocol splits it (see [`crate::moves`]): the files under
    /// `from` leave, renamed, and are returned as `(id, new path, contents)`.
    pub fn move_out(&mut self, from: &str, to: &str) -> Vec<MovedFile> {
        let mut out = Vec::new();
        self.files.retain(|id, (full, contents)| match path::renamed(full, from, to) {
            Some(new) => {
                out.push((id.clone(), new, contents.clone()));
                false
            }
            None => true,
        });
        out
    }

    /// The destination half: the files [`Model::move_out`] returned arrive.
    pub fn move_in(&mut self, files: Vec<MovedFile>) {
        for (id, full, contents) in files {
            self.files.insert(id, (full, contents));
        }
    }

    /// Every document, in the order `(kind, id)`.
    pub fn docs(&self) -> Vec<Doc> {
        let mut out: BTreeMap<(Kind, String), Doc> = BTreeMap::new();
        for (id, (full, contents)) in &self.files {
            out.insert((Kind::File, id.clone()), Doc::File(FileDoc::at(id, full, contents, 0)));
        }
        for (id, u) in &self.users {
            out.insert((Kind::User, id.clone()), Doc::User(u.clone()));
        }
        for (id, (uid, name, title, body)) in &self.posts {
            let p = PostDoc { id: id.clone(), title: title.clone(), body: body.clone(), user: Author { id: uid.clone(), name: name.clone() }, pos: 0 };
            out.insert((Kind::Post, id.clone()), Doc::Post(p));
        }
        out.into_values().collect()
    }

    /// Files currently at full path `p`, for spot checks.
    pub fn file_path(&self, id: &str) -> Option<&str> {
        self.files.get(id).map(|(p, _)| p.as_str())
    }
}

/// What [`serialized`] found in the logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moves {
    /// Cross-key renames whose files arrived at their destination.
    pub arrived: usize,
    /// Those whose files took more than one message.
    pub chunked: usize,
}

/// The reference model of a topic's partitions (each a list of `(offset,
/// message)` in log order) in the order the system serialized them: each
/// partition's messages in log order, a rename across top-level
/// directories split into its two halves: its files leave at the rename's
/// place in the source's log and arrive at the place of the first message
/// carrying them in the destination's log (resends are ignored). The files
/// that arrive are the model's own, computed when they left, not the
/// messages'.
///
/// Dead letters an operator released: a command that a `REPLAY` control
/// message names (by its origin offset, in the same partition) was set
/// aside where it stood and is applied at its first `REPLAY` instead (a
/// replayed rename across trees leaves from there). `RESOLVE` changes no
/// document. Messages that do not decode (a poison, dead-lettered and
/// dropped) are left out of `logs` by the caller. A `DISCARD` (commands
/// set aside for good, which the log alone does not name) and a replayed
/// move chunk are not modelled (an error).
pub fn serialized(logs: &[Vec<(i64, crate::codec::Decoded)>]) -> Result<(Model, Moves), String> {
    serialized_with(logs, None)
}

/// [`serialized`] of logs that carry the commands of `domain` too (read
/// with a codec of it): [`Model::generic`] holds their documents.
pub fn serialized_with(logs: &[Vec<(i64, crate::codec::Decoded)>], domain: Option<&'static crate::domain::Domain>) -> Result<(Model, Moves), String> {
    use crate::codec::Decoded;
    use crate::command::control::Action;
    let codec = match domain {
        Some(d) => crate::codec::Codec::new().with_model(d),
        None => crate::codec::Codec::new(),
    };
    // Per partition, the origins of the commands an operator replayed.
    let replayed: Vec<std::collections::BTreeSet<i64>> = logs
        .iter()
        .map(|log| {
            log.iter()
                .filter_map(|(_, msg)| match msg {
                    Decoded::Control(c) if c.action == Action::Replay => Some(c.origin_offset),
                    _ => None,
                })
                .collect()
        })
        .collect();
    let mut applied_replays = std::collections::BTreeSet::new();
    let mut m = domain.map(Model::with_domain).unwrap_or_default();
    let mut cursor = vec![0usize; logs.len()];
    // The files each move took out of its source, by the move's position.
    let mut left: BTreeMap<(i32, i64), Vec<MovedFile>> = BTreeMap::new();
    let mut arrived = std::collections::BTreeSet::new();
    let mut chunked = std::collections::BTreeSet::new();
    loop {
        let mut progress = false;
        for (p, log) in logs.iter().enumerate() {
            while let Some((offset, msg)) = log.get(cursor[p]) {
                // A replayed command: the envelope the `REPLAY` carries.
                let replay;
                let command = match msg {
                    Decoded::Command(_) if replayed[p].contains(offset) => None,
                    Decoded::Command(e) => Some(e),
                    Decoded::Control(c) if c.action == Action::Replay && applied_replays.contains(&(p, c.origin_offset)) => None,
                    Decoded::Control(c) if c.action == Action::Replay => match codec.decode_message(&c.payload) {
                        Ok(Decoded::Command(e)) => {
                            replay = e;
                            Some(&replay)
                        }
                        Ok(_) => return Err(format!("partition {p} offset {offset}: a replayed move chunk, which the model does not cover")),
                        Err(e) => return Err(format!("partition {p} offset {offset}: a replay of a message that does not decode ({e})")),
                    },
                    // A tenant's move between placements: no effect on documents.
                    Decoded::Control(c) if matches!(c.action, Action::Resolve | Action::Place) => None,
                    Decoded::Control(_) => return Err(format!("partition {p} offset {offset}: a DISCARD, which the model does not cover")),
                    Decoded::Move(_) => None,
                };
                match (msg, command) {
                    // An owner change's upsert: after its delete under the
                    // previous key.
                    (_, Some(e)) if owner_change_waits(logs, &cursor, e) => break,
                    (_, Some(e)) => match (&e.command, e.command.destination_key()) {
                        (Command::RenamePath { from, to }, Some(_)) => {
                            left.insert((p as i32, *offset), m.move_out(from, to));
                        }
                        (c, _) => m.apply(c),
                    },
                    (Decoded::Move(mv), _) if mv.aborted => {
                        return Err(format!("partition {p} offset {offset}: the end of a move its source gave up, which the model does not cover"));
                    }
                    (Decoded::Move(mv), _) => {
                        if mv.chunk > 0 {
                            chunked.insert(mv.source());
                        }
                        if !arrived.contains(&mv.source()) {
                            // Not left its source yet in this order: wait.
                            let Some(files) = left.remove(&mv.source()) else { break };
                            m.move_in(files);
                            arrived.insert(mv.source());
                        }
                    }
                    (_, None) => {}
                }
                if let Decoded::Control(c) = msg {
                    if c.action == Action::Replay {
                        applied_replays.insert((p, c.origin_offset));
                    }
                }
                cursor[p] += 1;
                progress = true;
            }
        }
        if cursor.iter().zip(logs).all(|(c, l)| *c == l.len()) {
            break;
        }
        if !progress {
            return Err(format!("no order of the partitions' logs lets every move arrive after it left (stuck at {cursor:?})"));
        }
    }
    // A move none of whose files arrived must have moved nothing.
    if let Some((source, files)) = left.iter().find(|(_, f)| !f.is_empty()) {
        return Err(format!("the move at {source:?} left with {} files that never arrived", files.len()));
    }
    Ok((m, Moves { arrived: arrived.len(), chunked: chunked.len() }))
}

/// Whether `e`, an upsert giving its document another owner, must wait in
/// the serialized order: while the previous key's log still has, ahead of
/// its cursor, the delete of that document issued no later than `e` (its
/// delete half, which a producer sends first and waits for). The
/// producers' clock pairs the halves: good for one machine's producers
/// (tests, the demo).
fn owner_change_waits(logs: &[Vec<(i64, crate::codec::Decoded)>], cursor: &[usize], e: &crate::command::Envelope) -> bool {
    let (Some(previous), Some(delete)) = (e.command.previous_key(), e.command.owner_change_delete()) else { return false };
    let p = crate::command::partitioner::partition_of(previous, logs.len() as i32) as usize;
    logs[p][cursor[p]..].iter().any(|(_, m)| matches!(m, crate::codec::Decoded::Command(d) if d.issued_at <= e.issued_at && d.command == delete))
}

/// Compares two document sets (any order, bookkeeping ignored) and describes
/// up to `max` differences. Empty means equal.
pub fn diff(expected: Vec<Doc>, actual: Vec<Doc>, max: usize) -> Vec<String> {
    let key = |d: &Doc| (d.kind(), d.id().to_string());
    let mut exp: BTreeMap<_, _> = expected.into_iter().map(|d| (key(&d), d.without_pos())).collect();
    let mut out = Vec::new();
    let mut dup = std::collections::BTreeSet::new();
    for d in actual {
        let k = key(&d);
        let d = d.without_pos();
        match exp.remove(&k) {
            Some(e) if e == d => {}
            Some(e) => out.push(format!("{} {}: expected {e:?}, found {d:?}", k.0.as_str(), k.1)),
            None if dup.contains(&k) => out.push(format!("{} {}: duplicated", k.0.as_str(), k.1)),
            None => out.push(format!("{} {}: unexpected {d:?}", k.0.as_str(), k.1)),
        }
        dup.insert(k);
    }
    for ((kind, id), e) in exp {
        if !dup.contains(&(kind, id.clone())) {
            out.push(format!("{} {id}: missing, expected {e:?}", kind.as_str()));
        }
    }
    out.truncate(max);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Codec, Decoded};
    use crate::command::control::{Action, Control};
    use crate::command::Envelope;

    fn upsert(contents: &str) -> Command {
        Command::UpsertFile { id: "f".into(), path: "/a/f.txt".into(), contents: contents.into(), previous_path: None }
    }

    fn control(action: Action, origin_offset: i64, payload: Vec<u8>) -> Decoded {
        Decoded::Control(Control { action, key: "/a".into(), dlq_partition: 0, dlq_offset: 0, through: 0, origin_offset, payload, requested_at: 0, through_at: 1 })
    }

    fn contents(m: &Model) -> Option<String> {
        m.docs().into_iter().find_map(|d| match d {
            Doc::File(f) => Some(f.contents),
            _ => None,
        })
    }

    /// A dead-lettered delete, released by `dlq reprocess`: skipped where
    /// it stood, applied at its `REPLAY` (after the upsert behind it), once
    /// however many `REPLAY`s name it.
    #[test]
    fn a_replayed_command_applies_at_its_replay_once() {
        let codec = Codec::new();
        let delete = Envelope::new(Command::DeleteFile { id: "f".into(), path: "/a/f.txt".into() });
        let log = vec![
            (0, Decoded::Command(Envelope::new(upsert("v1")))),
            (1, Decoded::Command(delete.clone())),
            (2, Decoded::Command(Envelope::new(upsert("v2")))),
            (3, control(Action::Replay, 1, codec.encode(&delete))),
            (4, control(Action::Resolve, -1, Vec::new())),
        ];
        let (m, _) = serialized(std::slice::from_ref(&log)).unwrap();
        assert_eq!(contents(&m), None, "deleted at its replay, after v2");
        let mut again = log.clone();
        again.push((5, Decoded::Command(Envelope::new(upsert("v3")))));
        again.push((6, control(Action::Replay, 1, codec.encode(&delete))));
        let (m, _) = serialized(&[again]).unwrap();
        assert_eq!(contents(&m).as_deref(), Some("v3"), "a second replay of the same letter changes nothing");
        let mut discarded = log;
        discarded.push((5, control(Action::Discard, -1, Vec::new())));
        assert!(serialized(&[discarded]).unwrap_err().contains("DISCARD"));
    }
}
