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
            Command::UpsertFile { id, path, contents } => {
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
            Command::UpsertPost { id, user_id, title, body } => {
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
