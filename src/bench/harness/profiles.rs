//! The profile-change and mixed-log phases of `denorm bench`: small
//! fan-outs as producers send them, against single-document upserts and
//! against a plain reader (embedded: a plain consumer of the same topic;
//! Elasticsearch: a plain `_bulk` of the same documents).

use std::collections::HashMap;
use std::path::Path;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

use super::table::{per_sec, phase, Row};
use super::worker::Worker;
use super::Bench;
use denorm::command::Command;
use denorm::index::{Author, Doc, FileDoc, PostDoc, UserDoc};
use denorm::produce::Producer;

/// Posts of each user of the profile-change phase.
pub(super) const POSTS_PER_USER: usize = 5;

/// Files of each user's directory in the mixed log.
const FILES_PER_USER: usize = 14;

fn user(i: usize, round: usize) -> Command {
    Command::UpsertUser { id: format!("pu{i}"), name: format!("Name{i} v{round}"), email: format!("u{i}@example.com"), dob: "1980-01-01".into() }
}

fn post(i: usize, j: usize, round: usize, rng: &mut StdRng) -> Command {
    Command::UpsertPost { id: format!("pu{i}-p{j}"), user_id: format!("pu{i}"), title: format!("post {j} of user {i}, take {round}"), body: denorm::demo::words(rng, 12 + j), previous_user_id: None }
}

/// `users` users with [`POSTS_PER_USER`] posts each.
pub(super) fn users_with_posts(users: usize) -> Vec<Command> {
    let mut rng = StdRng::seed_from_u64(users as u64);
    (0..users).flat_map(|i| std::iter::once(user(i, 0)).chain((0..POSTS_PER_USER).map(|j| post(i, j, 0, &mut rng))).collect::<Vec<_>>()).collect()
}

/// As many post upserts as the users have posts (their titles changed).
pub(super) fn post_updates(users: usize) -> Vec<Command> {
    let mut rng = StdRng::seed_from_u64(users as u64 + 1);
    (0..users).flat_map(|i| (0..POSTS_PER_USER).map(|j| post(i, j, 1, &mut rng)).collect::<Vec<_>>()).collect()
}

/// One profile change per user: a new name, which its posts carry.
pub(super) fn profile_changes(users: usize, round: usize) -> Vec<Command> {
    (0..users).map(|i| user(i, round)).collect()
}

/// A log as producers write it: `users` users (ids of their own, `mx..`),
/// each created, then its [`POSTS_PER_USER`] posts, [`FILES_PER_USER`]
/// files in a directory of its own and one profile change in a random order
/// (the change after at least one post), the users' streams interleaved at
/// random. 21 commands per user. Returns the log and the documents its
/// commands write, one per write (a profile change writes its user and the
/// posts it renames), for a plain `_bulk` of the same documents.
pub(super) fn mixed(users: usize) -> (Vec<Command>, Vec<Doc>) {
    let mut rng = StdRng::seed_from_u64(0x6d69786564 ^ users as u64);
    let mut streams: Vec<Vec<Command>> = (0..users)
        .map(|i| {
            let id = format!("mx{i}");
            let mut rest: Vec<Command> = (0..POSTS_PER_USER)
                .map(|j| Command::UpsertPost { id: format!("{id}-p{j}"), user_id: id.clone(), title: format!("post {j} of {id}"), body: denorm::demo::words(&mut rng, 12 + j), previous_user_id: None })
                .collect();
            rest.extend((0..FILES_PER_USER).map(|j| Command::UpsertFile {
                id: format!("{id}-f{j}"),
                path: format!("/{id}/d{}/file{j}.txt", j % 3),
                contents: denorm::demo::words(&mut rng, 8 + j),
                previous_path: None,
            }));
            rest.shuffle(&mut rng);
            let change = Command::UpsertUser { id: id.clone(), name: format!("{id} renamed"), email: format!("{id}@example.com"), dob: "1990-01-01".into() };
            let first_post = rest.iter().position(|c| matches!(c, Command::UpsertPost { .. })).unwrap_or(0);
            let at = rng.random_range(first_post + 1..=rest.len());
            rest.insert(at, change);
            let created = Command::UpsertUser { id: id.clone(), name: id.clone(), email: format!("{id}@example.com"), dob: "1990-01-01".into() };
            std::iter::once(created).chain(rest).rev().collect()
        })
        .collect();
    // Interleaved: each next command from a user drawn at random.
    let mut log = Vec::with_capacity(users * (2 + POSTS_PER_USER + FILES_PER_USER));
    let mut live: Vec<usize> = (0..users).collect();
    while !live.is_empty() {
        let k = rng.random_range(0..live.len());
        match streams[live[k]].pop() {
            Some(c) => log.push(c),
            None => {
                live.swap_remove(k);
            }
        }
    }
    (log.clone(), documents_written(&log))
}

/// The documents `log`'s commands write, one per write, as a plain indexer
/// of the same data would send them.
fn documents_written(log: &[Command]) -> Vec<Doc> {
    let mut names: HashMap<&str, &str> = HashMap::new();
    let mut posts: HashMap<&str, Vec<PostDoc>> = HashMap::new();
    let mut out = Vec::new();
    for (pos, c) in log.iter().enumerate() {
        let pos = pos as u64;
        match c {
            Command::UpsertUser { id, name, email, dob } => {
                names.insert(id, name);
                for p in posts.get_mut(id.as_str()).into_iter().flatten() {
                    if p.user.name != *name {
                        p.user.name = name.clone();
                        out.push(Doc::Post(p.clone()));
                    }
                }
                out.push(Doc::User(UserDoc { id: id.clone(), name: name.clone(), email: email.clone(), dob: dob.clone(), pos }));
            }
            Command::UpsertPost { id, user_id, title, body, .. } => {
                let doc = PostDoc { id: id.clone(), title: title.clone(), body: body.clone(), user: Author { id: user_id.clone(), name: names.get(user_id.as_str()).unwrap_or(&"").to_string() }, pos };
                out.push(Doc::Post(doc.clone()));
                posts.entry(user_id).or_default().push(doc);
            }
            Command::UpsertFile { id, path, contents, .. } => out.push(Doc::File(FileDoc::at(id, path, contents, pos))),
            _ => {}
        }
    }
    out
}

impl Bench<'_> {
    /// The profile-change phase, then the mixed-log phase, on the
    /// benchmark's topic and index (`index`), with `worker` applying it.
    /// Returns the worker running again.
    pub(super) async fn profiles_phase(&self, worker: Worker, group: &str, index: &Path, producer: &Producer, rows: &mut Vec<Row>, results: &mut Map<String, Value>) -> anyhow::Result<Worker> {
        let users = self.a.profile_users as usize;
        if users == 0 {
            return Ok(worker);
        }
        let posts = users * POSTS_PER_USER;
        phase(&format!("profile changes: loading {users} users with {POSTS_PER_USER} posts each"));
        producer.send_all(users_with_posts(users), 10_000, |_| {}).await?;
        self.wait_applied(&worker, index, None).await?;
        phase(&format!("profile changes: baseline, {posts} post upserts caught up by a fresh worker"));
        worker.stop().await?;
        producer.send_all(post_updates(users), 10_000, |_| {}).await?;
        let (worker, took, cpu_single) = self.catch_up(group, index, "the post upserts").await?;
        let single = posts as f64 / took.as_secs_f64();
        phase(&format!("profile changes: {users} profile changes ({POSTS_PER_USER} posts each) caught up by a fresh worker"));
        worker.stop().await?;
        producer.send_all(profile_changes(users, 1), 10_000, |_| {}).await?;
        let (worker, took, cpu_profiles) = self.catch_up(group, index, "the profile changes").await?;
        let rate = users as f64 / took.as_secs_f64();
        rows.push(Row::new(
            format!("{users} profile changes ({POSTS_PER_USER} posts each)"),
            format!("{} ({} posts/s)", per_sec(rate, "commands"), per_sec(rate * POSTS_PER_USER as f64, "")),
            format!("post upserts {}", per_sec(single, "commands")),
            Some(rate / single),
            ">= 50%",
        ));
        results.insert(
            "profile_changes".into(),
            json!({"users": users, "posts_per_user": POSTS_PER_USER, "seconds": took.as_secs_f64(), "rate": rate, "single_document_rate": single, "ratio": rate / single, "cpu": cpu_profiles, "single_document_cpu": cpu_single}),
        );

        let (log, docs) = mixed(users);
        let n = log.len() as u64;
        phase(&format!("mixed log: {n} commands of {users} users (profile, {POSTS_PER_USER} posts, {FILES_PER_USER} files, a profile change each), interleaved"));
        worker.stop().await?;
        let start = self.ends()?;
        producer.send_all(log, 10_000, |_| {}).await?;
        let (baseline, name) = match &self.es {
            None => (self.raw_consume(&start, n)?, "plain consumer"),
            Some(es) => (super::elastic::raw_bulk_docs(es, &docs).await?, "plain _bulk"),
        };
        phase("mixed log: denorm run catches up");
        let (worker, took, cpu) = self.catch_up(group, index, "the mixed log").await?;
        let rate = n as f64 / took.as_secs_f64();
        let target = if self.es.is_some() { ">= 80%" } else { ">= 90%" };
        rows.push(Row::new(format!("mixed log of {n} commands"), per_sec(rate, "commands"), format!("{name} {}", per_sec(baseline, "")), Some(rate / baseline), target));
        results.insert(
            "mixed_log".into(),
            json!({"commands": n, "documents_written": docs.len(), "seconds": took.as_secs_f64(), "rate": rate, "baseline": name, "baseline_rate": baseline, "ratio": rate / baseline, "cpu": cpu}),
        );
        Ok(worker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mixed_log_holds_each_users_commands_in_a_producers_order() {
        let (log, docs) = mixed(50);
        assert_eq!(log.len(), 50 * (2 + POSTS_PER_USER + FILES_PER_USER));
        for i in 0..50 {
            let id = format!("mx{i}");
            let mine: Vec<&Command> = log.iter().filter(|c| c.key() == id || c.key() == format!("/{id}")).collect();
            assert_eq!(mine.len(), 2 + POSTS_PER_USER + FILES_PER_USER, "{id}");
            assert!(matches!(mine[0], Command::UpsertUser { name, .. } if *name == id), "{id} is created first");
            let change = mine.iter().rposition(|c| matches!(c, Command::UpsertUser { .. })).unwrap();
            assert!(mine[..change].iter().any(|c| matches!(c, Command::UpsertPost { .. })), "{id}'s profile change renames at least one post");
        }
        // The model's documents are the last of each written.
        let mut model = denorm::model::Model::default();
        log.iter().for_each(|c| model.apply(c));
        let mut last: HashMap<(denorm::index::Kind, String), Doc> = HashMap::new();
        for d in docs {
            last.insert((d.kind(), d.id().to_string()), d.without_pos());
        }
        let mut want = model.docs();
        want.sort_by_key(|d| (d.kind(), d.id().to_string()));
        let mut got: Vec<Doc> = last.into_values().collect();
        got.sort_by_key(|d| (d.kind(), d.id().to_string()));
        assert_eq!(got, want);
    }
}
