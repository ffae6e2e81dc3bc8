//! Per-command progress (issue 45): what key lanes applied above the
//! checkpoint is recorded with the documents, and a new owner of the
//! partition does not apply it again. Both backends.

use std::time::Duration;

use denorm::command::Command;

use crate::common::*;

/// A rename held in its key's lane (fault `fanout.hold`); five files of
/// another key after it are applied and committed; the worker is stopped
/// with the rename unfinished. The next worker resumes at the rename (the
/// checkpoint stops before it) and applies the rename and the held key's
/// later file, and skips the other key's five files: before, it applied
/// them again (harmless, but a rebalance re-applied everything since the
/// oldest unfinished fan-out began).
fn a_new_owner_skips_what_was_applied_above_the_checkpoint(r: Rig) {
    let index = r.index.clone();
    r.on_fault("fanout.hold", "/held\n");
    let w = r.worker(&["--page-size", "10"]);
    let mut commands = files_under("h", "/held/x", 30);
    commands.push(Command::RenamePath { from: s("/held/x"), to: s("/held/y") });
    commands.extend(files_under("o", "/other", 5));
    commands.push(Command::UpsertFile { id: s("late"), path: s("/held/x/late.txt"), contents: s("x"), previous_path: None });
    let log = produce(&r.cfg, commands);
    let has = |id: &str| dump(&index).iter().any(|d| d.id() == id);
    eventually(Duration::from_secs(60), || format!("the other key's files while the rename is held\n{}", w.log()), || (0..5).all(|i| has(&format!("o{i}"))).then_some(()));
    let (status, log1) = w.terminate_with_log();
    assert!(status.success(), "{log1}");
    r.off_fault("fanout.hold");

    let w = r.worker(&["--page-size", "10"]);
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&w]);
    assert_matches_model(&index, &log);
    let m = w.http_get("/metrics").1;
    let applied = metric(&m, "denorm_commands_total", &[("outcome", "applied")]);
    let skipped = metric(&m, "denorm_commands_total", &[("outcome", "duplicate")]);
    assert!(applied == 2.0 && skipped >= 5.0, "the next worker applied {applied} commands (the rename and the held key's later file are due) and skipped {skipped}\n{}", w.log());
    let log2 = w.log();
    assert!(w.terminate().success(), "{log2}");
}

#[test]
fn a_new_owner_skips_what_was_applied_above_the_checkpoint_on_the_embedded_index() {
    a_new_owner_skips_what_was_applied_above_the_checkpoint(Rig::new(1));
}

#[test]
fn a_new_owner_skips_what_was_applied_above_the_checkpoint_on_elasticsearch() {
    a_new_owner_skips_what_was_applied_above_the_checkpoint(Rig::elastic(1));
}
