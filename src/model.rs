//! Reference model: the plainest possible implementation of the command
//! semantics, independent of `apply/` and of any index. The demo and the
//! tests compare the real index against it.

use std::collections::BTreeMap;

use crate::command::{path, Command};
use crate::index::{Author, Doc, FileDoc, Kind, PostDoc, UserDoc};

#[derive(Debug, Default, Clone)]
pub struct Model {
    /// file id -> (full path, contents)
    files: BTreeMap<String, (String, String)>,
    users: BTreeMap<String, UserDoc>,
    /// post id -> (user id, copied author name, title, body)
    posts: BTreeMap<String, (String, String, String, String)>,
}

impl Model {
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
        }
    }

    /// The source half of a rename across top-level directories, as the
    /// move protocol splits it (see [`crate::moves`]): the files under
    /// `from` leave, renamed, and are returned as `(id, new path, contents)`.
    pub fn move_out(&mut self, from: &str, to: &str) -> Vec<(String, String, String)> {
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
    pub fn move_in(&mut self, files: Vec<(String, String, String)>) {
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
/// messages'. Control messages are not modelled (an error).
pub fn serialized(logs: &[Vec<(i64, crate::codec::Decoded)>]) -> Result<(Model, Moves), String> {
    use crate::codec::Decoded;
    let mut m = Model::default();
    let mut cursor = vec![0usize; logs.len()];
    let mut left: BTreeMap<(i32, i64), Vec<(String, String, String)>> = BTreeMap::new();
    let mut arrived = std::collections::BTreeSet::new();
    let mut chunked = std::collections::BTreeSet::new();
    loop {
        let mut progress = false;
        for (p, log) in logs.iter().enumerate() {
            while let Some((offset, msg)) = log.get(cursor[p]) {
                match msg {
                    // An owner change's upsert: after its delete under the
                    // previous key.
                    Decoded::Command(e) if owner_change_waits(logs, &cursor, e) => break,
                    Decoded::Command(e) => match (&e.command, e.command.destination_key()) {
                        (Command::RenamePath { from, to }, Some(_)) => {
                            left.insert((p as i32, *offset), m.move_out(from, to));
                        }
                        (c, _) => m.apply(c),
                    },
                    Decoded::Move(mv) if mv.aborted => {
                        return Err(format!("partition {p} offset {offset}: the end of a move its source gave up, which the model does not cover"));
                    }
                    Decoded::Move(mv) => {
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
                    Decoded::Control(_) => return Err(format!("partition {p} offset {offset}: a control message, which the model does not cover")),
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
