//! Command -> effects on documents: what to scan and how to rewrite. The
//! rewrite rules are pure functions; [`apply`] drives any [`Shard`].
//!
//! Every effect is guarded by the document's log position: a document is
//! only written by a command later in the log than the one that last wrote
//! it. So re-applying any suffix of the log (crash redelivery, or a command
//! cut short after a backend's intermediate commit) changes nothing.

mod model;
mod repair;

pub use repair::{document, repair_guard, repairable, RepairGuard};

use crate::command::{path, Command};
use crate::index::{newer, put_guarded, Author, Doc, FileDoc, IndexError, Kind, Origin, PostDoc, Scan, Shard, UserDoc, Wanted};

/// Default number of documents read per page of a fan-out scan.
pub const DEFAULT_PAGE_SIZE: usize = 1000;

/// How fan-outs are paged and throttled.
#[derive(Debug, Clone, Copy)]
pub struct FanOut {
    /// Documents read per page of a scan.
    pub page_size: usize,
    /// Pause after every `page_size` scanned documents (0: none).
    pub page_pause: std::time::Duration,
}

impl FanOut {
    pub fn pages_of(page_size: usize) -> Self {
        FanOut { page_size: page_size.max(1), page_pause: std::time::Duration::ZERO }
    }

    /// Runs a rewrite scan, throttled.
    pub(crate) fn rewrite<S: Shard + ?Sized>(&self, shard: &mut S, scan: &Scan, rule: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<u64, IndexError> {
        let mut seen = 0usize;
        shard.rewrite(scan, self.page_size, &mut |d| {
            seen += 1;
            if !self.page_pause.is_zero() && seen.is_multiple_of(self.page_size) {
                std::thread::sleep(self.page_pause);
            }
            rule(d)
        })
    }
}

/// Applies `cmd`, found at log position `pos`, to `shard`. Returns the number
/// of documents written. Does not commit.
pub fn apply<S: Shard + ?Sized>(shard: &mut S, cmd: &Command, pos: u64, fan_out: FanOut) -> Result<u64, IndexError> {
    match cmd {
        Command::UpsertFile { id, path, contents, .. } => upsert(shard, cmd, Doc::File(FileDoc::at(id, path, contents, pos))),
        Command::DeleteFile { id, .. } => delete_guarded(shard, Kind::File, id, pos),
        Command::RenamePath { .. } | Command::UpsertUser { .. } => {
            let scan = fan_out_scan(cmd).expect("a fan-out");
            let docs = fan_out.rewrite(shard, &scan, &mut |d| fan_out_rule(cmd, pos, d))?;
            Ok(docs + fan_out_finish(shard, cmd, pos)?)
        }
        Command::UpsertPost { id, user_id, title, body, .. } => {
            let name = match shard.get(Kind::User, user_id)? {
                Some(Doc::User(u)) => u.name,
                _ => String::new(),
            };
            let author = Author { id: user_id.clone(), name };
            upsert(shard, cmd, Doc::Post(PostDoc { id: id.clone(), title: title.clone(), body: body.clone(), user: author, pos }))
        }
        Command::DeletePost { id, .. } => delete_guarded(shard, Kind::Post, id, pos),
        Command::DeleteUser { id } => delete_guarded(shard, Kind::User, id, pos),
        Command::Model(b) => model::apply(shard, b, pos, fan_out),
    }
}

/// What a fan-out command scans ([`Command::is_fan_out`]): a rename's files,
/// a profile change's posts. Run in one call by [`apply`], or a page at a
/// time by key lanes: [`fan_out_rule`] for each scanned document, then
/// [`fan_out_finish`].
pub fn fan_out_scan(cmd: &Command) -> Option<Scan> {
    match cmd {
        Command::RenamePath { from, .. } => Some(Scan::FilesWithin { path: from.clone() }),
        Command::UpsertUser { id, name, .. } => Some(Scan::PostsOfUserNotNamed { user_id: id.clone(), name: name.clone() }),
        Command::Model(b) => model::fan_out_scan(b),
        _ => None,
    }
}

/// The scans of an owner's dependents that applying `cmd` runs, to read
/// them ahead together with other commands' (`Shard::prefetch_scans`): a
/// profile change's, and a declared model's owner upsert's or patch's, of
/// every kind that copies from the owner.
pub fn dependents_scans(cmd: &Command) -> Vec<Scan> {
    match cmd {
        Command::Model(b) => model::dependents_scans(b),
        Command::UpsertUser { .. } => fan_out_scan(cmd).into_iter().collect(),
        _ => Vec::new(),
    }
}

/// The new version of a document a fan-out command at `pos` scanned, if it
/// changes.
pub fn fan_out_rule(cmd: &Command, pos: u64, doc: &Doc) -> Option<Doc> {
    match cmd {
        Command::RenamePath { from, to } => move_file(doc, from, to, pos),
        Command::UpsertUser { id, name, .. } => set_author_name(doc, id, name, pos),
        Command::Model(b) => model::fan_out_rule(b, pos, doc),
        _ => None,
    }
}

/// Runs the rest of a fan-out begun with [`Shard::rewrite_begin`] (all
/// its pages, then [`fan_out_finish`]). Returns the documents written.
pub fn fan_out_rest<S: Shard + ?Sized>(shard: &mut S, cmd: &Command, pos: u64, pages: &mut crate::index::Pages) -> Result<u64, IndexError> {
    let mut written = 0;
    loop {
        let (n, done) = shard.rewrite_page(pages, &mut |d| fan_out_rule(cmd, pos, d))?;
        written += n;
        if done {
            return Ok(written + fan_out_finish(shard, cmd, pos)?);
        }
    }
}

/// What a fan-out command writes once its scan is complete: a profile
/// change's profile (last: if the command is cut short, the profile still
/// looks unapplied and a retry finishes the posts).
pub fn fan_out_finish<S: Shard + ?Sized>(shard: &mut S, cmd: &Command, pos: u64) -> Result<u64, IndexError> {
    match cmd {
        Command::UpsertUser { id, name, email, dob } => {
            let user = UserDoc { id: id.clone(), name: name.clone(), email: email.clone(), dob: dob.clone(), pos };
            put_guarded(shard, Doc::User(user))
        }
        Command::Model(b) => model::fan_out_finish(shard, b, pos),
        _ => Ok(0),
    }
}

/// The documents applying `cmd` reads first (its position guard's, and a
/// post's author): what a backend can fetch for many commands at once
/// ([`Shard::prefetch`]). A fan-out's scan is not among them.
/// An upsert's own document is read for its position guard only
/// ([`Wanted::upsert`]), unless it is an owner change, whose take-over
/// reads the version it replaces.
pub fn reads(cmd: &Command) -> Vec<Wanted> {
    let own = |kind, id: &str| match cmd.previous_key() {
        None => Wanted::upsert(kind, id),
        Some(_) => Wanted::contents(kind, id),
    };
    match cmd {
        Command::UpsertFile { id, .. } => vec![own(Kind::File, id)],
        Command::DeleteFile { id, .. } => vec![Wanted::contents(Kind::File, id)],
        Command::UpsertUser { id, .. } => vec![Wanted::upsert(Kind::User, id)],
        Command::UpsertPost { id, user_id, .. } => vec![Wanted::contents(Kind::User, user_id), own(Kind::Post, id)],
        Command::DeletePost { id, .. } => vec![Wanted::contents(Kind::Post, id)],
        Command::DeleteUser { id } => vec![Wanted::contents(Kind::User, id)],
        Command::RenamePath { .. } => Vec::new(),
        Command::Model(b) => model::reads(b),
    }
}

/// The document of an upsert: an owner change takes it over from the key
/// it leaves (whose copy the change's delete half removes there); any other
/// upsert writes it unless this shard holds a version at least as new.
fn upsert<S: Shard + ?Sized>(shard: &mut S, cmd: &Command, doc: Doc) -> Result<u64, IndexError> {
    match cmd.previous_key() {
        Some(key) => shard.take_over(doc, &Origin { key, partition: None }),
        None => put_guarded(shard, doc),
    }
}

pub(crate) fn delete_guarded<S: Shard + ?Sized>(shard: &mut S, kind: Kind, id: &str, pos: u64) -> Result<u64, IndexError> {
    match shard.position(kind, id)? {
        Some(existing) if newer(pos, existing) => shard.delete(kind, id, pos).map(|_| 1),
        Some(_) => Ok(0),
        None => {
            // Not here: deleted already, never written, or held under
            // another key (a delete naming the wrong key, which is not
            // applied there: loud, not silent).
            // Best effort: a diagnostic, never a reason to fail the delete
            // (another process may be rewriting the shard it reads).
            if let Ok(Some(holder)) = shard.held_elsewhere(kind, id) {
                metrics::counter!(crate::metrics::OWNER_CONFLICTS_TOTAL).increment(1);
                tracing::warn!(kind = kind.as_str(), id = %crate::command::tenant::Shown(id), held_by_partition = holder, "a delete names a document another key's partition holds; not applied there (delete it under its own key)");
            }
            Ok(0)
        }
    }
}

/// The rename rule: the file moves when its full path is `from` or lies
/// beneath it, and the rename is newer than the file's last write.
pub fn move_file(doc: &Doc, from: &str, to: &str, pos: u64) -> Option<Doc> {
    let Doc::File(f) = doc else { return None };
    if !newer(pos, f.pos) {
        return None;
    }
    let target = path::renamed(&f.full_path(), from, to)?;
    Some(Doc::File(FileDoc::at(&f.id, &target, &f.contents, pos)))
}

/// The profile rule: a post of the user gets the user's new name.
pub fn set_author_name(doc: &Doc, user_id: &str, name: &str, pos: u64) -> Option<Doc> {
    let Doc::Post(p) = doc else { return None };
    // A post of another user now (its owner changed since the scan read
    // it) is not this profile change's (review of Elasticsearch, F1).
    if p.user.id != user_id || !newer(pos, p.pos) || p.user.name == name {
        return None;
    }
    let mut p = p.clone();
    p.user.name = name.to_string();
    p.pos = pos;
    Some(Doc::Post(p))
}

#[cfg(test)]
mod embedded_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::memory::MemoryShard;
    use crate::model::Model;
    use proptest::prelude::*;

    fn s(x: &str) -> String {
        x.to_string()
    }
    fn upsert(id: &str, p: &str) -> Command {
        Command::UpsertFile { id: s(id), path: s(p), contents: format!("contents of {id}"), previous_path: None }
    }
    fn rename(from: &str, to: &str) -> Command {
        Command::RenamePath { from: s(from), to: s(to) }
    }
    fn user(id: &str, name: &str) -> Command {
        Command::UpsertUser { id: s(id), name: s(name), email: s("e@x"), dob: s("1970-01-01") }
    }
    fn post(id: &str, user: &str) -> Command {
        Command::UpsertPost { id: s(id), user_id: s(user), title: s("t"), body: s("b"), previous_user_id: None }
    }

    /// Review of Elasticsearch, F1: the profile rule, applied to the post
    /// there now after a conflict, leaves another user's post alone (its
    /// owner changed since the scan read it).
    #[test]
    fn the_profile_rule_renames_only_the_users_own_posts() {
        let p = |user_id: &str| Doc::Post(crate::index::PostDoc { id: s("p"), title: s("t"), body: s("b"), user: crate::index::Author { id: s(user_id), name: s("Old") }, pos: 3 });
        assert!(set_author_name(&p("u1"), "u1", "New", 10).is_some());
        assert_eq!(set_author_name(&p("u2"), "u1", "New", 10), None);
    }

    fn run(log: &[Command]) -> MemoryShard {
        let mut shard = MemoryShard::new();
        for (pos, c) in log.iter().enumerate() {
            apply(&mut shard, c, pos as u64, FanOut::pages_of(7)).unwrap();
        }
        shard
    }

    fn files(shard: &MemoryShard) -> Vec<(String, String)> {
        shard
            .docs
            .values()
            .filter_map(|d| match d {
                Doc::File(f) => Some((f.id.clone(), f.full_path())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn directory_rename_moves_every_file_beneath_and_nothing_else() {
        let shard =
            run(&[upsert("a", "/c/projects/es/README.txt"), upsert("b", "/c/projects/x.txt"), upsert("c", "/c/projectsX/y.txt"), upsert("d", "/c/other.txt"), rename("/c/projects", "/c/work")]);
        assert_eq!(files(&shard), vec![(s("a"), s("/c/work/es/README.txt")), (s("b"), s("/c/work/x.txt")), (s("c"), s("/c/projectsX/y.txt")), (s("d"), s("/c/other.txt")),]);
        let Some(Doc::File(a)) = shard.docs.get(&(Kind::File, s("a"))) else { panic!() };
        assert_eq!(a.tree(), vec!["/c", "/c/work", "/c/work/es"]);
        assert_eq!(a.name, "README.txt");
    }

    #[test]
    fn file_rename_moves_only_that_file() {
        let shard = run(&[upsert("a", "/c/p/README.txt"), upsert("b", "/c/p/README.txt2"), rename("/c/p/README.txt", "/c/p/README.md")]);
        assert_eq!(files(&shard), vec![(s("a"), s("/c/p/README.md")), (s("b"), s("/c/p/README.txt2"))]);
    }

    #[test]
    fn concurrent_renames_apply_in_log_order() {
        let base = [upsert("r", "/clinton/projects/elasticsearch/README.txt")];
        let dir = rename("/clinton/projects", "/clinton/work");
        let file = rename("/clinton/projects/elasticsearch/README.txt", "/clinton/projects/elasticsearch/README.md");
        let dir_first = run(&[base[0].clone(), dir.clone(), file.clone()]);
        assert_eq!(files(&dir_first), vec![(s("r"), s("/clinton/work/elasticsearch/README.txt"))]);
        let file_first = run(&[base[0].clone(), file, dir]);
        assert_eq!(files(&file_first), vec![(s("r"), s("/clinton/work/elasticsearch/README.md"))]);
    }

    #[test]
    fn user_rename_rewrites_every_post_and_new_posts_copy_the_name() {
        let shard = run(&[user("1", "John"), post("p1", "1"), post("p2", "1"), post("p3", "2"), user("1", "Johnny"), post("p4", "1")]);
        let names: Vec<_> = shard
            .docs
            .values()
            .filter_map(|d| match d {
                Doc::Post(p) => Some((p.id.clone(), p.user.name.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(names, vec![(s("p1"), s("Johnny")), (s("p2"), s("Johnny")), (s("p3"), s("")), (s("p4"), s("Johnny"))]);
    }

    #[test]
    fn post_before_its_author_gets_the_name_when_the_author_appears() {
        let shard = run(&[post("p1", "9"), user("9", "Late")]);
        let Some(Doc::Post(p)) = shard.docs.get(&(Kind::Post, s("p1"))) else { panic!() };
        assert_eq!(p.user.name, "Late");
    }

    #[test]
    fn deletes_remove_documents() {
        let shard = run(&[upsert("a", "/c/a.txt"), post("p", "1"), Command::DeleteFile { id: s("a"), path: s("/c/a.txt") }, Command::DeletePost { id: s("p"), user_id: s("1") }]);
        assert!(shard.docs.is_empty());
    }

    #[test]
    fn reapplying_a_half_done_rename_finishes_it() {
        let log = [upsert("a", "/c/d/1"), upsert("b", "/c/d/2"), upsert("e", "/c/d/3"), rename("/c/d", "/c/e")];
        let mut shard = run(&log[..3]);
        // Simulate a crash after the rename wrote only one document.
        let mut budget = 1;
        shard
            .rewrite(&Scan::FilesWithin { path: s("/c/d") }, 7, &mut |d| {
                if budget == 0 {
                    return None;
                }
                budget -= 1;
                move_file(d, "/c/d", "/c/e", 3)
            })
            .unwrap();
        apply(&mut shard, &log[3], 3, FanOut::pages_of(7)).unwrap();
        assert_eq!(files(&shard), files(&run(&log)));
    }

    fn arb_command() -> impl Strategy<Value = Command> {
        let dir = prop::sample::select(vec!["/c/a", "/c/a/b", "/c/b", "/c/a/b/c", "/c/d"]);
        let id = prop::sample::select(vec!["1", "2", "3", "4"]);
        let name = prop::sample::select(vec!["Ann", "Bob", "Cy"]);
        prop_oneof![
            4 => (id.clone(), dir.clone(), id.clone()).prop_map(|(i, d, n)| upsert(i, &format!("{d}/f{n}"))),
            1 => (id.clone(), dir.clone()).prop_map(|(i, d)| Command::DeleteFile { id: s(i), path: format!("{d}/x") }),
            3 => (dir.clone(), dir.clone()).prop_filter("valid", |(f, t)| !path::is_within(t, f)).prop_map(|(f, t)| rename(f, t)),
            2 => (id.clone(), name).prop_map(|(i, n)| user(i, n)),
            3 => (id.clone(), id.clone()).prop_map(|(p, u)| post(p, u)),
            1 => (id.clone(), id.clone()).prop_map(|(p, u)| Command::DeletePost { id: s(p), user_id: s(u) }),
            1 => id.prop_map(|u| Command::DeleteUser { id: s(u) }),
        ]
    }

    fn docs(shard: &MemoryShard) -> Vec<Doc> {
        shard.docs.values().cloned().map(Doc::without_pos).collect()
    }

    proptest! {
        #[test]
        fn redelivered_suffix_changes_nothing(log in prop::collection::vec(arb_command(), 1..40), cut in 0usize..40) {
            let once = run(&log);
            let mut twice = once.clone();
            let start = cut.min(log.len());
            for (pos, c) in log.iter().enumerate().skip(start) {
                apply(&mut twice, c, pos as u64, FanOut::pages_of(3)).unwrap();
            }
            prop_assert_eq!(docs(&once), docs(&twice));
        }

        #[test]
        fn agrees_with_the_reference_model(log in prop::collection::vec(arb_command(), 1..40)) {
            let shard = run(&log);
            let mut model = Model::default();
            for c in &log { model.apply(c); }
            prop_assert_eq!(docs(&shard), model.docs());
        }
    }
}
