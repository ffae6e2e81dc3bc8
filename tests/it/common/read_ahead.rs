//! The contract of dependents read ahead ([`Shard::prefetch_scans`]), for
//! any backend: a window of profile changes whose owners' posts were read
//! in one request before the window ran, with writes of those keys between
//! the read and each change (a new post, a deletion, an edit, a second
//! change of the same user, a user created in the window). Each change
//! rewrites exactly its owner's posts as they are by then. Run on the
//! stateful test store of `tests/it/elastic_contracts/` (which also counts
//! the searches) and on both backends of the suite (`tests/it/scenarios.rs`),
//! with the compiled-in commands and with the same commands of
//! `models/files-and-posts.toml` (`tests/it/model_apply.rs`).

use denorm::apply::{apply, fan_out_rest, fan_out_scan, FanOut};
use denorm::command::Command;
use denorm::index::{Backend, Checkpoint, Shard};

fn user(id: &str, name: &str) -> Command {
    Command::UpsertUser { id: id.into(), name: name.into(), email: format!("{id}@x"), dob: "1970-01-01".into() }
}

fn post(id: &str, user_id: &str, title: &str) -> Command {
    Command::UpsertPost { id: id.into(), user_id: user_id.into(), title: title.into(), body: "b".into(), previous_user_id: None }
}

/// Applies `c` at `pos` as a worker does: a fan-out's scan read whole as
/// it begins, over the pending writes.
fn run(shard: &mut Box<dyn Shard + Send>, c: &Command, pos: u64) {
    match fan_out_scan(c) {
        Some(scan) => {
            assert!(shard.fan_out_reads_pending(&scan, 64), "{c:?}: the scan reads the pending writes");
            let mut pages = shard.rewrite_begin(&scan, 64).unwrap();
            assert!(pages.is_one_page(), "{c:?}: read whole as it began");
            fan_out_rest(shard.as_mut(), c, pos, &mut pages).unwrap();
        }
        None => {
            apply(shard.as_mut(), c, pos, FanOut::pages_of(64)).unwrap();
        }
    }
    shard.mark_applied(Checkpoint::new(pos, 0));
}

/// Runs the contract on `b`'s shard 0 and returns the log it applied:
/// eight users with three posts each, committed; then `before_window`;
/// then the window. The caller compares the index with the model of the
/// log.
pub fn profile_changes_read_ahead(b: &dyn Backend, before_window: &mut dyn FnMut()) -> Vec<Command> {
    profile_changes_read_ahead_as(b, before_window, &|c| c.clone())
}

/// [`profile_changes_read_ahead`], each command applied as `sent` makes it
/// (the same command of a model); returns the log as compiled-in commands.
pub fn profile_changes_read_ahead_as(b: &dyn Backend, before_window: &mut dyn FnMut(), sent: &dyn Fn(&Command) -> Command) -> Vec<Command> {
    let mut log = Vec::new();
    for u in 0..8 {
        log.push(user(&format!("u{u}"), "Old"));
        for k in 0..3 {
            log.push(post(&format!("p{u}-{k}"), &format!("u{u}"), "t"));
        }
    }
    let mut shard = b.open_shard(0).unwrap();
    for (pos, c) in log.iter().enumerate() {
        run(&mut shard, &sent(c), pos as u64);
    }
    shard.commit().unwrap();
    // A fan-out after the commit: its refresh makes the writes searchable.
    let first = user("u0", "First");
    run(&mut shard, &sent(&first), log.len() as u64);
    log.push(first);
    let window = vec![
        user("u1", "New1"),
        post("p0-new", "u0", "written after the read"),
        user("u0", "New0"),
        Command::DeletePost { id: "p2-0".into(), user_id: "u2".into() },
        user("u2", "New2"),
        post("p3-1", "u3", "edited after the read"),
        user("u3", "New3"),
        user("u4", "New4"),
        post("p4-new", "u4", "after its owner's change"),
        user("u4", "Again4"),
        post("p8-0", "u8", "before its owner"),
        user("u8", "Created8"),
        user("u5", "New5"),
        user("u6", "New6"),
        user("u7", "New7"),
    ];
    let window: Vec<(Command, Command)> = window.into_iter().map(|c| (sent(&c), c)).collect();
    let scans: Vec<_> = window.iter().filter_map(|(c, _)| fan_out_scan(c)).collect();
    assert_eq!(scans.len(), 10, "every profile change of the window is a fan-out the worker reads ahead");
    before_window();
    shard.prefetch_scans(&scans).unwrap();
    for (i, (c, logical)) in window.iter().enumerate() {
        let pos = log.len() as u64;
        run(&mut shard, c, pos);
        log.push(logical.clone());
        if i == 6 {
            // A commit published by a refresh: what was read ahead is
            // dropped with the writes it was kept beside.
            shard.commit().unwrap();
            assert!(shard.searchable(true).unwrap());
        }
    }
    shard.commit().unwrap();
    log
}
