//! Fault injection for the test suite, compiled in only with the cargo
//! feature `failpoints` (which `scripts/test.sh` enables); release builds
//! without it have no fault points at all.
//!
//! A fault point `name` is active while the file `$DENORM_FAULTS/name`
//! exists, so a test can switch faults on and off in a running worker
//! process. The file's contents are the fault's argument.
//!
//! Fault points:
//! - `index.io`: every write of the embedded index's directory fails with an
//!   I/O error (a full or failing disk).
//! - `shard.close-early`: an embedded shard's writer is dropped without
//!   waiting for its merges, as tantivy's close does when an indexing
//!   thread failed (its merges go on as the next writer opens).
//! - `index.reject`: commands whose key is one of the file's lines are
//!   rejected by the index (a permanent failure, like a mapping conflict);
//!   it writes `index.reject.reached` when it rejects one.
//! - `index.reject-commit`: a commit holding a write of a document whose id
//!   is one of the file's lines is rejected (like an Elasticsearch bulk item
//!   refused at commit time, which cannot be traced to its command at once).
//!   On Elasticsearch the server refuses it: the document is sent with a
//!   position its mapping cannot parse.
//! - `dlq.send`: writes to the dead-letter topic fail.
//! - `move.send`: a cross-key rename's writes of its documents to the
//!   destination's partition fail.
//! - `move.pause-between-chunks`: the source of a cross-key rename whose
//!   documents take several messages waits after each but the last, for as
//!   long as the fault is on; it adds `<from> -> <to>` to
//!   `move.pause-between-chunks.reached` when it starts waiting.
//! - `move.fail-after-chunks`: the source of a cross-key rename fails for
//!   good (like an index refusing its scan) once it has written as many
//!   chunks of the move as the file says.
//! - `move.crash-after-send`: the process aborts once a cross-key rename's
//!   documents are handed to the destination, before the source deletes
//!   them or commits.
//! - `apply.hold`: a command whose key is one of the file's lines waits
//!   before it is applied, holding its partition, for as long as the fault
//!   is on (a partition that a replay runs behind the others); it writes
//!   `apply.hold.reached` when a command starts waiting.
//! - `fanout.hold`: a fan-out running in a key lane whose key is one of the
//!   file's lines runs no page for as long as the fault is on (the other
//!   keys' commands go on); it writes `fanout.hold.reached` when a page is
//!   held.
//! - `fanout.page-fail`: a page of a fan-out running in a key lane whose
//!   key is one of the file's lines fails with a transient index error; it
//!   writes `fanout.page-fail.reached`.
//! - `kafka.commit`: offset commits are lost before they reach the broker
//!   (like commits refused by a coordinator that has just restarted).
//! - `rebuild.verified`: `rebuild --verify` waits after its comparison,
//!   before it checks the live generation again and cuts over ([`hold`]).
//! - `apply.place`: a live worker waits before it handles a `PLACE`
//!   control message ([`hold`]): it has not taken the new placement.
//! - `rebuild.awaits-acks`: not a fault; `rebuild --tenant` writes
//!   `rebuild.awaits-acks.reached` when its fence first finds a partition
//!   whose live writer has not taken the new placement.
//! - `rebuild.fenced`: `rebuild --tenant` waits once it has fenced the
//!   live workers off the tenant's indexes ([`hold`]).
//! - `rebuild.tenant-aliases`: `rebuild --tenant` aborts between its
//!   cutover's `_aliases` request and the placement's record of it.
//! - `spill.read`: reading a spilled message back from its file fails
//!   (recorded reached), while the file exists.
//! - `verify.replay`, `verify.round`, `verify.before-plan`: `denorm verify`
//!   waits while the file exists ([`hold`]): once a round chose where it
//!   stops, before its next round, and before its repair plan.

/// The argument of fault point `name` when it is active.
#[cfg(feature = "failpoints")]
pub fn active(name: &str) -> Option<String> {
    let dir = std::env::var_os("DENORM_FAULTS")?;
    std::fs::read_to_string(std::path::Path::new(&dir).join(name)).ok()
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn active(_name: &str) -> Option<String> {
    None
}

/// Records that fault point `name` took effect: the file
/// `$DENORM_FAULTS/<name>.reached`, for a test to wait on.
#[cfg(feature = "failpoints")]
pub fn reached(name: &str) {
    if let Some(dir) = std::env::var_os("DENORM_FAULTS") {
        let _ = std::fs::write(std::path::Path::new(&dir).join(format!("{name}.reached")), "");
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn reached(_name: &str) {}

/// [`reached`], adding `line` to the file: which of several things took
/// effect.
#[cfg(feature = "failpoints")]
pub fn reached_with(name: &str, line: &str) {
    use std::io::Write;
    if let Some(dir) = std::env::var_os("DENORM_FAULTS") {
        let path = std::path::Path::new(&dir).join(format!("{name}.reached"));
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{line}");
        }
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn reached_with(_name: &str, _line: &str) {}

/// Waits while fault point `name` is active, once [`reached`]: a test
/// holds the process there, does something, and lets it go on.
pub fn hold(name: &str) {
    if active(name).is_some() {
        reached(name);
        while active(name).is_some() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// Whether fault point `name` is active and lists `item` on a line.
pub fn lists(name: &str, item: &str) -> bool {
    active(name).is_some_and(|a| a.lines().any(|l| l.trim() == item))
}

/// An I/O error for fault point `name`, if it is active.
pub fn io(name: &str) -> std::io::Result<()> {
    match active(name) {
        Some(_) => Err(std::io::Error::other(format!("injected fault {name}"))),
        None => Ok(()),
    }
}
