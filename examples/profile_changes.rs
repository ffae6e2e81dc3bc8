//! Where a profile change's time goes on the embedded index, without
//! Kafka: USERS users with 5 posts each are indexed into one shard and
//! committed, then, in batches of BATCH commands committed as a worker
//! commits them, as many post upserts (the baseline), and one profile
//! change per user (a new name: 5 posts rewritten each) through `apply`.
//! Prints the rate of each; run it under `perf record` for a profile
//! (docs/benchmark.md, "Where a profile change's time goes").
//!
//! With `model` after them, the same commands are sent as commands of
//! `models/files-and-posts.toml` and applied by the generic code.
//!
//! ```sh
//! cargo run --release --example profile_changes [-- USERS [BATCH [model]]]
//! ```

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::Instant;

use denorm::apply::{apply, FanOut, DEFAULT_PAGE_SIZE};
use denorm::command::generic::legacy;
use denorm::command::{Command, Envelope};
use denorm::index::embedded::EmbeddedIndex;
use denorm::index::{Checkpoint, Shard};

fn user(i: usize, round: usize) -> Command {
    Command::UpsertUser { id: format!("u{i}"), name: format!("Name{i} v{round}"), email: "e@x".into(), dob: "1980-01-01".into() }
}

fn post(i: usize, j: usize, round: usize) -> Command {
    Command::UpsertPost { id: format!("u{i}-p{j}"), user_id: format!("u{i}"), title: format!("post {j} take {round}"), body: "some words of a body".into(), previous_user_id: None }
}

/// Applies `log` from position `start`, committing every `batch`
/// commands; commands per second.
fn run(shard: &mut dyn Shard, log: &[Command], start: usize, batch: usize) -> f64 {
    let t = Instant::now();
    for (i, c) in log.iter().enumerate() {
        let pos = (start + i) as u64;
        apply(shard, c, pos, FanOut::pages_of(DEFAULT_PAGE_SIZE)).expect("apply");
        shard.mark_applied(Checkpoint::new(pos, 0));
        if (i + 1) % batch == 0 {
            shard.commit().expect("commit");
        }
    }
    shard.commit().expect("commit");
    log.len() as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: usize| args.get(i).map_or(default, |a| a.parse().expect("a number"));
    let (users, batch) = (number(0, 20_000), number(1, 2_000).max(1));
    let model = (args.get(2).map(String::as_str) == Some("model")).then(legacy::domain);
    let sent = |commands: Vec<Command>| match model {
        None => commands,
        Some(d) => commands.into_iter().map(|c| legacy::command_of(d, &Envelope::new(c))).collect(),
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let index = EmbeddedIndex::open(dir.path(), "profile-changes").expect("the index").with_model(model);
    index.check_current_model(true).expect("the model recorded");
    let mut shard = index.open_shard(0, 64 << 20).expect("the shard");
    let load = sent((0..users).flat_map(|i| std::iter::once(user(i, 0)).chain((0..5).map(move |j| post(i, j, 0)))).collect());
    let loaded = run(&mut shard, &load, 0, batch);
    let updates = sent((0..users).flat_map(|i| (0..5).map(move |j| post(i, j, 1))).collect());
    let single = run(&mut shard, &updates, load.len(), batch);
    let changes = sent((0..users).map(|i| user(i, 1)).collect());
    let profiles = run(&mut shard, &changes, load.len() + updates.len(), batch);
    println!("load of {} commands: {loaded:.0}/s", load.len());
    println!("{} post upserts: {single:.0}/s", updates.len());
    println!("{users} profile changes (5 posts each): {profiles:.0}/s, {:.0} % of the post upserts' rate", 100.0 * profiles / single);
}
