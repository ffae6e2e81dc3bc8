//! Reading past a flood larger than the queue (issue 47). A held tenant's
//! messages ([`super::hold`]) stay in memory up to a bound (a share of
//! `--queue-kb`, [`Spill::bound`]). Past it they are *spilled*: dropped,
//! and read again from the broker later, so that the partition is never
//! paused for them and the other tenants' messages behind them are read
//! and applied as they come.
//!
//! The spilled messages are read again by a second reader of their own
//! (a *rereading*, [`Feed::Again`]): the consumer thread reads the
//! partition from the first spilled message with another client while the
//! partition's own reading goes on forward, never sought back. A
//! rereading starts once the hold has room for half its bound again; it
//! takes the spilled tenant's messages into the hold in log order, passes
//! every other message over (handled when it was first read), and ends
//! when the hold is full again, when every spilled message is taken, or
//! when it reaches the highest offset the forward reading has handled.
//!
//! Which messages are spilled needs no list: from the first spilled on,
//! every message of the spilled tenant read forward is spilled (its order
//! is kept: a message held in memory is always older than every spilled
//! one), up to the highest offset read. The tracker counts each spilled
//! message unfinished, so the offset recorded as applied stays below the
//! first, and a crash or a rebalance reads them again from the checkpoint.
//! A barrier of another tenant read while messages are spilled must come
//! after them: it and everything after it are dropped, and the partition
//! is sought back to it once the spill is over. [`Spill`] does no I/O;
//! the applier's part follows it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use metrics::{counter, gauge};
use rdkafka::Offset;
use tracing::debug;

use super::{hold::tenant_of, queued_size, Applier, Feed, Record};
use crate::metrics as m;

/// A tenant, as [`super::hold`] names it (`None`: the default tenant).
type Tenant = Option<String>;

/// What becomes of a message read forward ([`Spill::read`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Read {
    /// Nothing to do with spilling: handled as it would be.
    Pass,
    /// A message of the spilled tenant behind spilled ones: spilled (the
    /// caller drops it).
    Behind,
}

/// What becomes of a message of a rereading ([`Spill::again`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Again {
    /// Not a spilled message (another tenant's, handled when read
    /// forward), or of a rereading that is over: dropped.
    Drop,
    /// The oldest spilled message: held now if the hold has room
    /// ([`Spill::taken`]), spilled again otherwise ([`Spill::spill_again`]).
    Take,
    /// Past the highest offset read forward: the rereading caught up with
    /// the forward reading and is over ([`Spill::reread_over`]).
    Caught,
}

/// See the module's doc.
#[derive(Debug, Default)]
pub(super) struct Spill {
    /// The tenant spilled, while messages are.
    tenant: Option<Tenant>,
    /// The oldest spilled message (where a rereading starts), or an offset
    /// before it with no message of the tenant between.
    first: i64,
    /// How many are spilled, not taken back yet.
    count: usize,
    /// The highest offset read forward (and handled, held or spilled), and
    /// the one read before it.
    through: Option<i64>,
    before_through: Option<i64>,
    /// The rereading in progress, by its number.
    reread: Option<u64>,
    /// The number of the last rereading started (never reused, so that a
    /// message of an earlier one is told apart).
    rereads: u64,
    /// A barrier of another tenant read at this offset: it and what
    /// follows are read again after the spilled messages.
    cut: Option<i64>,
    /// When a spill was last reported (kept by [`Spill::clear`]).
    reported: Option<Instant>,
}

/// What a rereading takes at most (a rereading starts when the hold has
/// room for this much, [`Applier::reread_if_due`]): half the hold's bound
/// of a queue of `queue_bytes`. Also what its client fetches ahead.
pub(crate) fn rereading_bytes(queue_bytes: usize) -> usize {
    Spill::bound(queue_bytes) / 2
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
        self.count > 0
    }

    /// Spilled messages not taken back yet.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether messages are spilled before `offset`: a barrier there must
    /// come after them (an older barrier, released from the hold, goes
    /// before them, as it was read).
    pub fn before(&self, offset: i64) -> bool {
        self.active() && self.first < offset
    }

    /// Whether `tenant` is the one spilled.
    pub fn spills(&self, tenant: &Tenant) -> bool {
        self.active() && self.tenant.as_ref() == Some(tenant)
    }

    /// The tenant spilled, while one is.
    pub fn tenant(&self) -> Option<&Tenant> {
        self.tenant.as_ref().filter(|_| self.active())
    }

    /// Whether the message at `offset` is dropped unread: at or past a
    /// barrier cut off (it is read again once the spilled messages are).
    pub fn cut_off(&self, offset: i64) -> bool {
        self.cut.is_some_and(|c| offset >= c)
    }

    /// The message at `offset`, of `tenant`, read forward, is taken by the
    /// applier's loop, before it is held or handled. See [`Read`]. A
    /// message read before and handed back (released from the hold, or
    /// after waiting behind a fan-out or for a lane) is [`Read::Pass`]: it
    /// is at or below the highest offset read.
    pub fn read(&mut self, offset: i64, tenant: &Tenant) -> Read {
        if self.through.is_some_and(|t| offset <= t) {
            return Read::Pass;
        }
        self.before_through = self.through;
        self.through = Some(offset);
        if !self.spills(tenant) {
            return Read::Pass;
        }
        self.count += 1;
        Read::Behind
    }

    /// The message at `offset`, of `tenant`, read by rereading number
    /// `reread`. See [`Again`]. Offsets come in log order from the
    /// rereading's start at the first spilled message: the first of the
    /// tenant's at or after it is the oldest spilled.
    pub fn again(&self, reread: u64, offset: i64, tenant: &Tenant) -> Again {
        if self.reread != Some(reread) || offset < self.first {
            return Again::Drop;
        }
        if self.through.is_none_or(|t| offset > t) {
            return Again::Caught;
        }
        match self.spills(tenant) {
            true => Again::Take,
            false => Again::Drop,
        }
    }

    /// The message at `offset` of `tenant` is the first spilled, nothing
    /// being spilled: the hold is full.
    pub fn start(&mut self, offset: i64, tenant: &Tenant) {
        debug_assert!(!self.active(), "spilling already");
        (self.tenant, self.first, self.count) = (Some(tenant.clone()), offset, 1);
    }

    /// The oldest spilled message, reread ([`Again::Take`]), found no room
    /// in the hold: spilled again, the first still, and the rereading is
    /// over (the next starts here).
    pub fn spill_again(&mut self, offset: i64) {
        self.first = offset;
        self.reread = None;
    }

    /// The oldest spilled message, reread ([`Again::Take`]), was held: the
    /// next spilled one comes after it. Whether the spill is over (the
    /// last was taken back: the rereading is over too).
    pub fn taken(&mut self, offset: i64) -> bool {
        debug_assert!(self.active() && offset >= self.first, "taken {offset}, not spilled");
        self.count -= 1;
        self.first = offset + 1;
        if self.count == 0 {
            (self.tenant, self.reread) = (None, None);
        }
        self.count == 0
    }

    /// The rereading caught up with the forward reading ([`Again::Caught`]).
    pub fn reread_over(&mut self) {
        self.reread = None;
    }

    /// A barrier of another tenant is read at `offset` while messages are
    /// spilled: it and every message after it are dropped unread, and read
    /// again after the spilled ones.
    pub fn cut(&mut self, offset: i64) {
        debug_assert_eq!(self.through, Some(offset), "a barrier cut off is the last message read");
        self.cut = Some(offset);
        self.through = self.before_through;
    }

    /// Where the partition is to be sought back to, once: the barrier cut
    /// off, once every spilled message is taken back.
    pub fn take_cut(&mut self) -> Option<i64> {
        match self.active() {
            true => None,
            false => self.cut.take(),
        }
    }

    /// Whether a rereading is to start now, with `room` in the hold for
    /// half its bound of the spilled tenant's messages: messages are
    /// spilled and none is being reread.
    pub fn due(&self, room: bool) -> bool {
        room && self.active() && self.reread.is_none()
    }

    /// A rereading starts: its number, and where it reads from.
    pub fn reread(&mut self) -> (u64, i64) {
        debug_assert!(self.active(), "nothing spilled");
        self.rereads += 1;
        self.reread = Some(self.rereads);
        (self.rereads, self.first)
    }

    /// Whether a rereading is in progress.
    pub fn rereading(&self) -> bool {
        self.reread.is_some()
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
    /// below every spilled message); the rereadings' numbers go on.
    pub fn clear(&mut self) {
        *self = Spill { reported: self.reported, rereads: self.rereads, ..Spill::default() };
    }
}

impl Applier {
    /// `msg` is spilled: dropped, unfinished until reread.
    pub(super) fn spilled(&self, msg: &Record) {
        let mut lanes = self.lanes.borrow_mut();
        lanes.tracker.defer(msg.offset());
        self.spilled_gauge(lanes.spill.len());
        #[cfg(test)]
        self.shared.stats.spilled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Starts a rereading of the spilled messages if one is due
    /// ([`Spill::due`]): the hold is empty, or holds the spilled tenant's
    /// messages in at most half its bound.
    pub(super) fn reread_if_due(&self) {
        let mut lanes = self.lanes.borrow_mut();
        if !lanes.spill.active() {
            return; // every message's path: nothing more to look at
        }
        let hold = &lanes.hold;
        let room = hold.is_empty() || hold.held_tenant() == lanes.spill.tenant() && hold.bytes() + rereading_bytes(self.shared.cfg.queue_bytes) <= Spill::bound(self.shared.cfg.queue_bytes);
        if !lanes.spill.due(room) {
            return;
        }
        let (reread, from) = lanes.spill.reread();
        debug!(partition = self.partition, reread, offset = from, spilled = lanes.spill.len(), "rereading the spilled messages");
        counter!(m::PARTITION_REREADS_TOTAL).increment(1);
        self.ask_reread(Some((reread, from)));
    }

    /// Asks the consumer thread to start rereading the partition (number,
    /// offset), or (`None`) to stop.
    pub(super) fn ask_reread(&self, from: Option<(u64, i64)>) {
        self.shared.rereads.lock().expect("rereads lock").insert(self.partition, from);
    }

    /// A message of rereading number `reread` ([`Spill::again`]): the
    /// oldest spilled message is held if the hold has room, spilled again
    /// otherwise (and the rereading stops); anything else is dropped. It
    /// leaves the queue's count either way.
    pub(super) fn reread_message(&self, reread: u64, msg: Record) {
        self.queued.take(queued_size(&msg));
        let (offset, t) = (msg.offset(), tenant_of(&msg).map(str::to_string));
        let mut lanes = self.lanes.borrow_mut();
        match lanes.spill.again(reread, offset, &t) {
            Again::Drop => {}
            Again::Caught => {
                lanes.spill.reread_over();
                drop(lanes);
                self.ask_reread(None);
            }
            Again::Take if lanes.hold.may_keep(&t) && self.room(&lanes.hold, &msg) => {
                let over = lanes.spill.taken(offset);
                lanes.hold.keep(t);
                self.spilled_gauge(lanes.spill.len());
                drop(lanes);
                self.hold_now(msg);
                if over {
                    self.ask_reread(None);
                }
            }
            Again::Take => {
                lanes.spill.spill_again(offset);
                drop(lanes);
                debug!(partition = self.partition, offset, spilled = self.lanes.borrow().spill.len(), "the hold is full again: the rereading stops");
                self.ask_reread(None);
            }
        }
    }

    /// Once the spill is over, a barrier cut off ([`Applier::cut_at`]) is
    /// read again: the partition is sought back to it (not positioned
    /// until the consumer thread says so). Whether it was.
    pub(super) fn sought_to_cut(&self) -> bool {
        let Some(at) = self.lanes.borrow_mut().spill.take_cut() else { return false };
        debug!(partition = self.partition, offset = at, "the spilled messages are taken back: reading again from the barrier cut off");
        self.seek(Offset::Offset(at));
        true
    }

    /// A barrier at `offset` comes after the spilled messages: it and what
    /// follows are read again after them, and everything held goes first.
    pub(super) fn cut_at(&self, offset: i64, ahead: &mut VecDeque<Feed>) {
        self.lanes.borrow_mut().spill.cut(offset);
        self.release(ahead, Some(offset));
    }

    /// Whether the message at `offset` is past a barrier cut off.
    pub(super) fn cut_off(&self, offset: i64) -> bool {
        self.lanes.borrow().spill.cut_off(offset)
    }

    pub(super) fn spilled_gauge(&self, n: usize) {
        gauge!(m::PARTITION_SPILLED_MESSAGES, "partition" => self.partition.to_string()).set(n as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> Tenant {
        Some(name.to_string())
    }

    /// Rereads `offsets` of `tenant` in rereading `reread`: what became of
    /// each, taking each [`Again::Take`] while `room` lasts and spilling it
    /// again after.
    fn again(s: &mut Spill, reread: u64, offsets: impl IntoIterator<Item = i64>, tenant: &Tenant, room: &mut usize) -> Vec<Again> {
        offsets
            .into_iter()
            .map(|o| {
                let a = s.again(reread, o, tenant);
                match (&a, *room > 0) {
                    (Again::Take, true) => {
                        *room -= 1;
                        s.taken(o);
                    }
                    (Again::Take, false) => s.spill_again(o),
                    (Again::Caught, _) => s.reread_over(),
                    (Again::Drop, _) => {}
                }
                a
            })
            .collect()
    }

    #[test]
    fn a_spilled_tenants_later_messages_are_spilled_and_reread_from_the_first_while_the_others_are_read_on() {
        let (noisy, quiet) = (t("noisy"), t("quiet"));
        let mut s = Spill::default();
        assert_eq!([0, 1, 2].map(|o| s.read(o, &noisy)), [Read::Pass, Read::Pass, Read::Pass], "nothing spilled yet");
        s.start(2, &noisy);
        assert!(s.spills(&noisy) && !s.spills(&quiet));
        assert_eq!([3, 4].map(|o| s.read(o, &noisy)), [Read::Behind, Read::Behind]);
        assert_eq!(s.read(5, &quiet), Read::Pass, "another tenant is handled as it comes");
        assert_eq!([6, 7].map(|o| s.read(o, &noisy)), [Read::Behind, Read::Behind]);
        assert_eq!(s.read(8, &quiet), Read::Pass);
        assert_eq!(s.len(), 5);
        assert!(!s.due(false), "no room in the hold");
        assert!(s.due(true));
        assert_eq!(s.reread(), (1, 2), "reread from the first spilled");
        assert!(!s.due(true), "being reread");
        let mut room = 2;
        assert_eq!(again(&mut s, 1, [2, 3, 4], &noisy, &mut room), [Again::Take, Again::Take, Again::Take]);
        assert!(!s.rereading(), "no room for 4: spilled again, the rereading over");
        assert_eq!(again(&mut s, 1, [5], &quiet, &mut room), [Again::Drop], "of a rereading that is over");
        // The forward reading went on meanwhile.
        assert_eq!(s.read(9, &quiet), Read::Pass);
        assert_eq!(s.read(10, &noisy), Read::Behind);
        assert_eq!(s.len(), 4, "4, 6, 7 and 10");
        assert_eq!(s.reread(), (2, 4));
        room = 10;
        let reads: Vec<Again> =
            [(4, &noisy), (5, &quiet), (6, &noisy), (7, &noisy), (8, &quiet), (9, &quiet), (10, &noisy)].into_iter().flat_map(|(o, t)| again(&mut s, 2, [o], t, &mut room)).collect();
        assert_eq!(reads, [Again::Take, Again::Drop, Again::Take, Again::Take, Again::Drop, Again::Drop, Again::Take], "the quiet tenant's were handled when read forward");
        assert!(!s.active() && !s.rereading(), "every spilled message taken back");
        assert_eq!(s.again(2, 11, &noisy), Again::Drop);
        assert_eq!(s.read(11, &noisy), Read::Pass, "nothing spilled: as any message");
        assert_eq!(s.read(8, &quiet), Read::Pass, "read before and handed back (it waited in a lane)");
    }

    #[test]
    fn a_rereading_ends_where_the_forward_reading_is() {
        let noisy = t("noisy");
        let mut s = Spill::default();
        s.read(1, &noisy);
        s.start(1, &noisy);
        s.read(2, &noisy);
        let (n, from) = s.reread();
        assert_eq!(from, 1);
        assert_eq!(s.again(n, 1, &noisy), Again::Take);
        assert!(!s.taken(1));
        assert_eq!(s.again(n, 2, &noisy), Again::Take);
        s.spill_again(2);
        // Read forward only now: the rereading is not to take it before.
        let (n, _) = s.reread();
        assert_eq!(s.again(n, 2, &noisy), Again::Take);
        assert!(s.taken(2));
        assert_eq!(s.again(n, 3, &noisy), Again::Drop, "over");
        s.read(3, &t("quiet"));
        s.start(4, &noisy);
        assert_eq!(s.read(4, &noisy), Read::Behind);
        let (n, _) = s.reread();
        assert_eq!(s.again(n, 5, &noisy), Again::Caught, "not read forward yet: it will be spilled when it is");
        s.reread_over();
        assert!(s.due(true), "the spilled message 4 is reread again");
        assert_eq!(s.reread().1, 4);
    }

    #[test]
    fn a_barrier_of_another_tenant_is_cut_off_and_read_again_after_the_spilled_messages() {
        let (noisy, quiet) = (t("noisy"), t("quiet"));
        let mut s = Spill::default();
        s.read(10, &noisy);
        s.start(10, &noisy);
        assert_eq!(s.read(11, &quiet), Read::Pass);
        assert_eq!(s.read(12, &quiet), Read::Pass, "the barrier is read");
        s.cut(12);
        assert!(s.cut_off(12) && s.cut_off(13) && !s.cut_off(11));
        assert_eq!(s.take_cut(), None, "not while messages are spilled");
        let (n, from) = s.reread();
        assert_eq!(from, 10);
        assert_eq!(s.again(n, 10, &noisy), Again::Take);
        assert!(s.taken(10));
        assert_eq!(s.take_cut(), Some(12), "sought back to the barrier");
        assert_eq!(s.take_cut(), None, "once");
        assert!(!s.cut_off(12));
        assert_eq!(s.read(12, &quiet), Read::Pass, "the barrier cut off is read as new");
    }

    #[test]
    fn a_message_of_the_default_tenant_is_spilled_as_any_tenants() {
        let mut s = Spill::default();
        s.read(3, &None);
        s.start(3, &None);
        assert!(s.spills(&None));
        assert_eq!(s.read(4, &None), Read::Behind);
        assert_eq!(s.read(5, &t("a")), Read::Pass);
        s.clear();
        assert!(!s.active());
        assert_eq!(s.read(6, &None), Read::Pass);
    }

    #[test]
    fn a_message_of_a_rereading_before_a_clear_is_never_taken() {
        let noisy = t("noisy");
        let mut s = Spill::default();
        s.read(3, &noisy);
        s.start(3, &noisy);
        let (old, _) = s.reread();
        s.clear();
        s.read(3, &noisy);
        s.start(3, &noisy);
        let (new, _) = s.reread();
        assert_ne!(old, new, "numbers are not reused");
        assert_eq!(s.again(old, 3, &noisy), Again::Drop);
        assert_eq!(s.again(new, 3, &noisy), Again::Take);
    }
}
