//! Reading past a flood larger than the queue (issue 47). A held tenant's
//! messages ([`super::hold`]) stay in memory up to a bound (a share of
//! `--queue-kb`, [`Spill::bound`]). Past it they are *spilled*: written to
//! a file of the partition's own ([`super::spill_file`]), so that the
//! partition is never paused for them and the other tenants' messages
//! behind them are read and applied as they come. Whenever the hold has
//! room, the oldest spilled messages are taken back into it, in order, and
//! released from it as any held message. A barrier of another tenant (a
//! move, an owner change, a control message), which must come after them
//! all, waits at the head while they are taken back and released before
//! it, a hold's worth at a time.
//!
//! Which messages are spilled: from the first spilled on, every message of
//! the spilled tenant read (its order is kept: a message held in memory is
//! always older than every spilled one), until every spilled message was
//! taken back. Only messages read for the first time are: one released and
//! held again stays in memory, past the bound if need be (it was in memory
//! already, and is older than what was taken back meanwhile). The file is
//! bounded (`--spill-mb`): once it is full, the
//! next message of the spilled tenant waits at the head as a barrier does,
//! and the partition reads on once it found room. The tracker counts each
//! spilled message unfinished, so the offset recorded as applied stays
//! below the first, and a crash or a rebalance reads them again from the
//! checkpoint; the file is emptied whenever the partition is sought.

use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

use tracing::warn;

use super::spill_file::SpillFile;
use super::{queued_size, Applier, Feed, Record};

/// A tenant, as [`super::hold`] names it (`None`: the default tenant).
type Tenant = Option<String>;

/// What becomes of a message read ([`Spill::read`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Read {
    /// Read for the first time, not behind spilled messages: handled as it
    /// would be.
    Pass,
    /// Read before and handed back (released from the hold, or after
    /// waiting behind a fan-out or for a lane): handled as it would be,
    /// and never spilled. It may be older than messages held since (taken
    /// back from the file): written to the file, it would come after them.
    Again,
    /// A message of the spilled tenant behind spilled ones: spilled.
    Behind,
    /// The same, with the file full: it waits for room at the head.
    Full,
}

/// See the module's doc.
#[derive(Debug, Default)]
pub(super) struct Spill {
    /// The tenant spilled, while messages are.
    tenant: Option<Tenant>,
    file: SpillFile,
    /// The highest offset read (and handled, held or spilled).
    through: Option<i64>,
    /// Writing to the file failed: nothing more is spilled before it is
    /// emptied (what failed to be written is kept in memory).
    failed: bool,
    /// When a spill was last reported (kept by [`Spill::clear`]).
    reported: Option<Instant>,
    /// Reading the file back failed.
    unreadable: Option<std::io::Error>,
}

/// A spill starting is reported again after this long.
const REPORT_EVERY: Duration = Duration::from_secs(60);

impl Spill {
    /// How many bytes of held messages a partition keeps in memory, of a
    /// queue of `queue_bytes`: three eighths, so that the queue keeps room
    /// for the other tenants' messages and is resumed (at half) while the
    /// hold is full.
    pub fn bound(queue_bytes: usize) -> usize {
        queue_bytes / 8 * 3
    }

    /// Whether messages are spilled.
    pub fn active(&self) -> bool {
        self.file.len() > 0
    }

    /// Spilled messages not taken back yet.
    pub fn len(&self) -> usize {
        self.file.len()
    }

    /// Whether messages are spilled before `offset`: a barrier there must
    /// come after them (an older barrier, released from the hold, goes
    /// before them, as it was read).
    pub fn before(&self, offset: i64) -> bool {
        self.file.first().is_some_and(|f| f < offset)
    }

    /// Whether `tenant` is the one spilled.
    pub fn spills(&self, tenant: &Tenant) -> bool {
        self.active() && self.tenant.as_ref() == Some(tenant)
    }

    /// The spilled tenant.
    pub fn tenant(&self) -> Option<&Tenant> {
        self.tenant.as_ref().filter(|_| self.active())
    }

    /// The message at `offset`, of `tenant`, is taken by the applier's
    /// loop, before it is held or handled, with the file holding at most
    /// `cap` bytes. See [`Read`]. A message read before and handed back
    /// (released from the hold, or after waiting behind a fan-out or for a
    /// lane) is [`Read::Again`]: it is at or below the highest offset read.
    pub fn read(&mut self, offset: i64, tenant: &Tenant, cap: u64) -> Read {
        if self.through.is_some_and(|t| offset <= t) {
            return Read::Again;
        }
        if self.spills(tenant) && (self.failed || self.file.bytes() >= cap) {
            return Read::Full; // read again, as new, once there is room
        }
        self.through = Some(offset);
        match self.spills(tenant) {
            true => Read::Behind,
            false => Read::Pass,
        }
    }

    /// `msg`, of `tenant`, is spilled (the first one: the hold is full),
    /// to a file in `dir`. An error writing is reported once; the message
    /// is kept all the same.
    pub fn push(&mut self, msg: &Record, tenant: &Tenant, dir: &Path) -> std::io::Result<()> {
        if !self.active() {
            self.tenant = Some(tenant.clone());
        }
        debug_assert_eq!(self.tenant.as_ref(), Some(tenant), "one tenant spilled at a time");
        let written = self.file.push(msg, dir);
        if written.is_err() {
            self.failed = true;
        }
        written
    }

    /// Takes the oldest spilled message back.
    pub fn pop(&mut self) -> std::io::Result<Option<Record>> {
        let msg = self.file.pop()?;
        if !self.active() {
            (self.tenant, self.failed) = (None, false);
        }
        Ok(msg)
    }

    /// Whether a spill that started now is worth reporting: none was
    /// within [`REPORT_EVERY`].
    pub fn report(&mut self, now: Instant) -> bool {
        let due = self.reported.is_none_or(|at| now.saturating_duration_since(at) >= REPORT_EVERY);
        if due {
            self.reported = Some(now);
        }
        due
    }

    /// Forgets everything (the partition is read again from the checkpoint,
    /// below every spilled message).
    pub fn clear(&mut self) -> std::io::Result<()> {
        (self.tenant, self.through, self.failed, self.unreadable) = (None, None, false, None);
        self.file.clear()
    }
}

impl Applier {
    /// `msg`, of `t`, is spilled: unfinished until taken back.
    pub(super) fn spilled(&self, msg: &Record, t: &Tenant) {
        let mut lanes = self.lanes.borrow_mut();
        if let Err(e) = lanes.spill.push(msg, t, &self.shared.cfg.spill_dir) {
            warn!(partition = self.partition, error = %e, dir = %self.shared.cfg.spill_dir.display(), "writing a spilled message failed: it is kept in memory, and the tenant's next messages wait until the spilled ones are taken back");
        }
        lanes.tracker.defer(msg.offset());
        self.spilled_gauge(lanes.spill.len());
        self.trace(msg.offset(), "spilled");
        #[cfg(test)]
        self.shared.stats.spilled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether messages are spilled.
    pub(super) fn spilling(&self) -> bool {
        self.lanes.borrow().spill.active()
    }

    /// Takes spilled messages back into the hold while it has room (and
    /// holds no other tenant). Returns how many.
    pub(super) fn take_back(&self) -> usize {
        let bound = Spill::bound(self.shared.cfg.queue_bytes);
        let Some(t) = self.lanes.borrow().spill.tenant().cloned() else { return 0 };
        let mut taken = 0;
        loop {
            let mut lanes = self.lanes.borrow_mut();
            if !lanes.hold.may_keep(&t) || (!lanes.hold.is_empty() && lanes.hold.bytes() >= bound) {
                break;
            }
            let msg = match lanes.spill.pop() {
                Ok(Some(msg)) => msg,
                Ok(None) => break,
                Err(e) => {
                    // Unreadable: the loop reads the partition again from
                    // its checkpoint ([`Applier::spill_failure`]).
                    lanes.spill.unreadable = Some(e);
                    break;
                }
            };
            if taken == 0 {
                lanes.hold.keep(t.clone());
            }
            drop(lanes);
            self.trace(msg.offset(), "taken back");
            self.hold_now(msg);
            taken += 1;
        }
        if taken > 0 {
            self.spilled_gauge(self.lanes.borrow().spill.len());
        }
        taken
    }

    /// `msg` (a barrier, or a message of the spilled tenant that found the
    /// file full) comes after the spilled messages: it goes back to the
    /// head of `ahead`, and a hold's worth of them, taken back, before it.
    pub(super) fn after_spilled(&self, msg: Record, ahead: &mut VecDeque<Feed>) {
        let offset = msg.offset();
        self.trace(offset, "after the spilled");
        self.queued.add(queued_size(&msg));
        ahead.push_front(Feed::Message(msg));
        self.take_back();
        self.release(ahead, Some(offset));
    }

    /// A spilled message could not be read back: the caller falls back to
    /// the checkpoint (which is below it).
    pub(super) fn spill_failure(&self) -> Option<std::io::Error> {
        self.lanes.borrow_mut().spill.unreadable.take()
    }

    pub(super) fn spilled_gauge(&self, n: usize) {
        self.spilled_messages.set(n as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: u64 = 1 << 30;

    fn t(name: &str) -> Tenant {
        Some(name.to_string())
    }

    fn rec(offset: i64) -> Record {
        Record { offset, key: Some(format!("k{offset}").into_bytes()), payload: Some(vec![7; 100]), timestamp_ms: None, signature: None }
    }

    /// Reads `offsets` of `tenant`, spilling each [`Read::Behind`].
    fn read(s: &mut Spill, offsets: impl IntoIterator<Item = i64>, tenant: &Tenant, cap: u64) -> Vec<Read> {
        offsets
            .into_iter()
            .map(|o| {
                let r = s.read(o, tenant, cap);
                if r == Read::Behind {
                    s.push(&rec(o), tenant, &std::env::temp_dir()).unwrap();
                }
                r
            })
            .collect()
    }

    fn pop(s: &mut Spill) -> Option<i64> {
        s.pop().unwrap().map(|r| r.offset)
    }

    #[test]
    fn a_spilled_tenants_later_messages_are_spilled_and_taken_back_in_order() {
        let (noisy, quiet) = (t("noisy"), t("quiet"));
        let mut s = Spill::default();
        assert_eq!(read(&mut s, [0, 1], &noisy, CAP), [Read::Pass, Read::Pass], "nothing spilled yet");
        assert_eq!(s.read(2, &noisy, CAP), Read::Pass);
        s.push(&rec(2), &noisy, &std::env::temp_dir()).unwrap(); // the first: the hold is full
        assert!(s.spills(&noisy) && !s.spills(&quiet));
        assert_eq!(read(&mut s, [3, 4], &noisy, CAP), [Read::Behind, Read::Behind]);
        assert_eq!(read(&mut s, [5], &quiet, CAP), [Read::Pass], "another tenant is handled as it comes");
        assert!(s.before(5) && !s.before(2), "a barrier at 5 comes after the spilled 2");
        assert_eq!(read(&mut s, [3], &noisy, CAP), [Read::Again], "read before and handed back");
        assert_eq!((s.len(), pop(&mut s), pop(&mut s)), (3, Some(2), Some(3)));
        assert_eq!(read(&mut s, [6], &noisy, CAP), [Read::Behind], "still spilled: behind 4");
        assert_eq!((pop(&mut s), pop(&mut s), pop(&mut s)), (Some(4), Some(6), None));
        assert!(!s.active() && s.tenant().is_none());
        assert_eq!(read(&mut s, [7], &noisy, CAP), [Read::Pass], "nothing spilled: as any message");
    }

    #[test]
    fn past_the_cap_the_spilled_tenants_next_message_waits_and_is_read_as_new_later() {
        let noisy = t("noisy");
        let mut s = Spill::default();
        let cap = 250; // two records of ~140 bytes
        s.read(0, &noisy, cap);
        s.push(&rec(0), &noisy, &std::env::temp_dir()).unwrap();
        assert_eq!(read(&mut s, [1], &noisy, cap), [Read::Behind]);
        assert_eq!(read(&mut s, [2], &noisy, cap), [Read::Full]);
        assert_eq!(read(&mut s, [2], &noisy, cap), [Read::Full], "not counted as read: still full");
        assert_eq!(pop(&mut s), Some(0));
        assert_eq!(read(&mut s, [2], &noisy, cap), [Read::Behind], "room again: spilled behind 1");
        assert_eq!(read(&mut s, [3], &t("quiet"), cap), [Read::Pass], "another tenant is not held up by the file");
        assert_eq!((pop(&mut s), pop(&mut s)), (Some(1), Some(2)));
    }

    #[test]
    fn a_message_of_the_default_tenant_is_spilled_as_any_tenants_and_clear_forgets() {
        let mut s = Spill::default();
        s.read(3, &None, CAP);
        s.push(&rec(3), &None, &std::env::temp_dir()).unwrap();
        assert!(s.spills(&None));
        assert_eq!(read(&mut s, [4], &None, CAP), [Read::Behind]);
        assert_eq!(read(&mut s, [5], &t("a"), CAP), [Read::Pass]);
        s.clear().unwrap();
        assert!(!s.active());
        assert_eq!(read(&mut s, [4], &None, CAP), [Read::Pass], "read again from the checkpoint: as new");
        assert_eq!(pop(&mut s), None);
    }
}
