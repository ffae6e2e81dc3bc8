//! Reading past a flood larger than the queue (issue 47). A held tenant's
//! messages ([`super::hold`]) stay in memory up to a bound (a share of
//! `--queue-kb`, [`Spill::bound`]). Past it they are *spilled*: dropped,
//! and read again from the broker later, so that the partition is never
//! paused for them and the other tenants' messages behind them are read
//! and applied as they come. Once the held messages are released (or
//! before a barrier of another tenant, which must come after them all),
//! the partition is sought back to the first spilled message and read
//! again: the spilled tenant's messages are taken in, held again up to the
//! bound and spilled again past it; every other message up to the highest
//! offset read before was handled then, and is passed over.
//!
//! Which messages are spilled needs no list: from the first spilled on,
//! every message of the spilled tenant read is spilled (its order is kept:
//! a message held in memory is always older than every spilled one), up to
//! the highest offset read. The tracker counts each spilled message
//! unfinished, so the offset recorded as applied stays below the first,
//! and a crash or a rebalance reads them again from the checkpoint.
//! [`Spill`] does no I/O; the applier's part follows it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use metrics::gauge;
use rdkafka::Offset;
use tracing::debug;

use super::{Applier, Feed, Record};
use crate::metrics as m;

/// A tenant, as [`super::hold`] names it (`None`: the default tenant).
type Tenant = Option<String>;

/// What becomes of a message read ([`Spill::read`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Read {
    /// Nothing to do with spilling: handled as it would be.
    Pass,
    /// Read again, and handled before: passed over.
    Handled,
    /// The oldest spilled message, read again: held now if the hold has
    /// room ([`Spill::taken`]), spilled again otherwise
    /// ([`Spill::spill_again`]).
    Oldest,
    /// A message of the spilled tenant behind spilled ones: spilled (the
    /// caller drops it).
    Behind,
}

/// See the module's doc.
#[derive(Debug, Default)]
pub(super) struct Spill {
    /// The tenant spilled, while messages are.
    tenant: Option<Tenant>,
    /// The oldest spilled message (where the partition is read again), or
    /// an offset before it with no message of the tenant between.
    first: i64,
    /// How many are spilled, not read again yet.
    count: usize,
    /// The highest offset read (and handled, held or spilled), and the one
    /// read before it.
    through: Option<i64>,
    before_through: Option<i64>,
    /// While the partition is read again: up to here, everything was read
    /// before.
    again_until: Option<i64>,
    /// The highest offset read in the reading again.
    again_at: Option<i64>,
    /// Where the partition is to be read from after a reading again that
    /// ended early ([`Spill::spill_again`]).
    skip_to: Option<i64>,
    /// A barrier of another tenant read at this offset: it and what
    /// follows are read again after the spilled messages.
    cut: Option<i64>,
    /// The partition was read to its end since it was last read again.
    caught_up: bool,
    /// Since when nothing is held in memory while messages are spilled.
    idle_since: Option<Instant>,
    /// When a spill was last reported (kept by [`Spill::clear`]).
    reported: Option<Instant>,
}

/// A spill starting is reported again after this long.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// How long the partition goes on reading forward with nothing held and
/// messages spilled before it reads them again without having reached the
/// end of the partition (a flood that never lets it): the spilled tenant's
/// share while the others keep coming.
pub(super) const CATCH_UP: Duration = Duration::from_secs(5);

impl Spill {
    /// How many bytes of held messages a partition keeps in memory, of a
    /// queue of `queue_bytes`: three eighths, so that the queue keeps room
    /// for the other tenants' messages and is resumed (at half) while the
    /// hold is full.
    pub fn bound(queue_bytes: usize) -> usize {
        queue_bytes / 8 * 3
    }

    /// Whether messages are spilled: then the partition is to be read
    /// again from the first once nothing is held in memory and nothing
    /// read waits to be handled.
    pub fn active(&self) -> bool {
        self.count > 0
    }

    /// Spilled messages not read again yet.
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

    /// Whether the message at `offset` is dropped unread: at or past a
    /// barrier cut off (it is read again once the spilled messages are).
    pub fn cut_off(&self, offset: i64) -> bool {
        self.cut.is_some_and(|c| offset >= c)
    }

    /// The message at `offset`, of `tenant`, is taken by the applier's
    /// loop, before it is held or handled. See [`Read`]. A message read
    /// before and handed back (released from the hold, or after waiting
    /// behind a fan-out or for a lane) is [`Read::Pass`]: it is at or below
    /// the highest offset read (in a reading again, read in it: the
    /// partition is read again only when no message waits in a lane).
    pub fn read(&mut self, offset: i64, tenant: &Tenant) -> Read {
        if let Some(until) = self.again_until {
            if offset <= until {
                // Read in this reading and handed back (released from the
                // hold, or by a lane): offsets come in order from the log.
                if self.again_at.is_some_and(|a| offset <= a) {
                    return Read::Pass;
                }
                self.again_at = Some(offset);
                if offset == until {
                    // Read again to the end of what was read before.
                    self.again_until = None;
                }
                return match self.spills(tenant) && offset >= self.first {
                    true => Read::Oldest,
                    false => Read::Handled,
                };
            }
            self.again_until = None;
        }
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

    /// The message at `offset` of `tenant` is the first spilled, nothing
    /// being spilled: the hold is full.
    pub fn start(&mut self, offset: i64, tenant: &Tenant) {
        debug_assert!(!self.active(), "spilling already");
        (self.tenant, self.first, self.count) = (Some(tenant.clone()), offset, 1);
    }

    /// The oldest spilled message, read again ([`Read::Oldest`]), found no
    /// room in the hold: spilled again, the first still. The rest of the
    /// reading again holds nothing to do (every other message in it was
    /// handled, every message of the tenant is spilled again): it ends
    /// here, and the partition is read on from after it
    /// ([`Spill::take_skip`]), so that a reading again reads about as many
    /// messages as the hold takes, not the whole backlog each time.
    pub fn spill_again(&mut self, offset: i64) {
        self.first = offset;
        self.skip_to = self.again_until.take().map(|u| u + 1);
    }

    /// Where to read on from, once, after a reading again that ended early.
    pub fn take_skip(&mut self) -> Option<i64> {
        self.skip_to.take()
    }

    /// The oldest spilled message, read again ([`Read::Oldest`]), was held:
    /// the next spilled one comes after it.
    pub fn taken(&mut self, offset: i64) {
        debug_assert!(self.active() && offset >= self.first, "taken {offset}, not spilled");
        self.count -= 1;
        self.first = offset + 1;
        if self.count == 0 {
            self.tenant = None;
        }
    }

    /// A barrier of another tenant is read at `offset` while messages are
    /// spilled: it and every message after it are dropped unread, and read
    /// again after the spilled ones.
    pub fn cut(&mut self, offset: i64) {
        debug_assert_eq!(self.through, Some(offset), "a barrier cut off is the last message read");
        self.cut = Some(offset);
        self.through = self.before_through;
    }

    /// Whether the partition is to be read again from the first spilled
    /// message now, with `held` messages in memory (none: the hold was
    /// released whole) and nothing read waiting: messages are spilled, the
    /// last reading again is over, and the partition was read to its end
    /// since (every other tenant's message read first), or [`CATCH_UP`]
    /// passed with nothing held.
    pub fn due(&mut self, held: bool, now: Instant) -> bool {
        if held || !self.active() {
            self.idle_since = None;
            return false;
        }
        let idle = *self.idle_since.get_or_insert(now);
        self.again_until.is_none() && (self.caught_up || now.saturating_duration_since(idle) >= CATCH_UP)
    }

    /// The partition was read to `end` (the consumer's position): a
    /// reading again whose last message is gone is over all the same.
    pub fn ended(&mut self, end: i64) {
        if self.again_until.is_some_and(|u| u < end) {
            self.again_until = None;
        }
        if self.again_until.is_none() && self.through.is_none_or(|t| t < end) {
            self.caught_up = true;
        }
    }

    /// The partition is sought back: where to. Everything up to the highest
    /// offset read is read again as such.
    pub fn read_again(&mut self) -> i64 {
        debug_assert!(self.active(), "nothing spilled");
        (self.again_until, self.again_at, self.cut, self.skip_to, self.caught_up, self.idle_since) = (self.through, None, None, None, false, None);
        self.first
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
    pub fn clear(&mut self) {
        *self = Spill { reported: self.reported, ..Spill::default() };
    }
}

impl Applier {
    /// `msg` is spilled: dropped, unfinished until read again.
    pub(super) fn spilled(&self, msg: &Record) {
        let mut lanes = self.lanes.borrow_mut();
        lanes.tracker.defer(msg.offset());
        self.spilled_gauge(lanes.spill.len());
        #[cfg(test)]
        self.shared.stats.spilled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the partition is to be read again from its first spilled
    /// message now: spilled messages wait, nothing is held in memory and no
    /// message waits in a key's lane (a message handed back from a lane
    /// while the partition is read again could not be told from its copy
    /// read again). `ahead` must be empty too (the caller's).
    pub(super) fn read_again_due(&self) -> bool {
        let mut lanes = self.lanes.borrow_mut();
        if !lanes.spill.active() {
            return false; // every message's path: nothing more to look at
        }
        let held = !lanes.hold.is_empty() || lanes.waiting();
        lanes.spill.due(held, Instant::now())
    }

    /// After a message handled by [`Applier::held`]: whether a reading
    /// again ended early ([`Spill::spill_again`]); then the partition is
    /// sought past it, and is not positioned until the consumer thread
    /// says so (what was read beyond the message is dropped meanwhile).
    pub(super) fn skipped(&self) -> bool {
        let Some(to) = self.lanes.borrow_mut().spill.take_skip() else { return false };
        debug!(partition = self.partition, offset = to, spilled = self.lanes.borrow().spill.len(), "the hold is full again: reading on from where the partition was read");
        self.seek(Offset::Offset(to));
        true
    }

    /// Seeks the partition back to its first spilled message
    /// ([`Applier::read_again_due`]): not positioned until the consumer
    /// thread says so.
    pub(super) fn read_again(&self) -> bool {
        let first = self.lanes.borrow_mut().spill.read_again();
        debug!(partition = self.partition, offset = first, spilled = self.lanes.borrow().spill.len(), "reading the spilled messages again");
        self.seek(Offset::Offset(first));
        false
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

    /// Reads `offsets` of `tenant`: what became of each, taking each
    /// [`Read::Oldest`] while `room` lasts and spilling it again after.
    fn read(s: &mut Spill, offsets: impl IntoIterator<Item = i64>, tenant: &Tenant, room: &mut usize) -> Vec<Read> {
        offsets
            .into_iter()
            .map(|o| {
                let r = s.read(o, tenant);
                if r == Read::Oldest {
                    match *room > 0 {
                        true => {
                            *room -= 1;
                            s.taken(o);
                        }
                        false => s.spill_again(o),
                    }
                }
                r
            })
            .collect()
    }

    #[test]
    fn a_spilled_tenants_later_messages_are_spilled_and_read_again_from_the_first() {
        let (noisy, quiet) = (t("noisy"), t("quiet"));
        let mut s = Spill::default();
        let mut room = 0;
        assert_eq!(read(&mut s, [0, 1, 2], &noisy, &mut room), [Read::Pass, Read::Pass, Read::Pass], "nothing spilled yet");
        s.start(2, &noisy);
        assert!(s.spills(&noisy) && !s.spills(&quiet));
        assert_eq!(read(&mut s, [3, 4], &noisy, &mut room), [Read::Behind, Read::Behind]);
        assert_eq!(read(&mut s, [5], &quiet, &mut room), [Read::Pass], "another tenant is handled as it comes");
        assert_eq!(read(&mut s, [6, 7], &noisy, &mut room), [Read::Behind, Read::Behind]);
        assert_eq!(read(&mut s, [8], &quiet, &mut room), [Read::Pass]);
        assert_eq!(s.len(), 5);
        assert_eq!(s.read_again(), 2);
        // Read again from 2: room for two.
        room = 2;
        assert_eq!(read(&mut s, [2, 3], &noisy, &mut room), [Read::Oldest, Read::Oldest]);
        assert_eq!(read(&mut s, [3], &noisy, &mut room), [Read::Pass], "read in this reading, held and handed back");
        assert_eq!(s.take_skip(), None);
        assert_eq!(read(&mut s, [4], &noisy, &mut room), [Read::Oldest], "no room left: spilled again");
        assert_eq!(s.take_skip(), Some(9), "the rest of the reading again is skipped: read on after 8");
        assert_eq!(s.take_skip(), None, "once");
        assert_eq!(read(&mut s, [9], &quiet, &mut room), [Read::Pass], "past what was read before");
        assert_eq!(read(&mut s, [10], &noisy, &mut room), [Read::Behind]);
        assert_eq!(s.len(), 4, "4, 6, 7 and 10");
        assert_eq!(s.read_again(), 4);
        room = 10;
        let reads: Vec<Read> = [(4, &noisy), (5, &quiet), (6, &noisy), (7, &noisy), (8, &quiet), (9, &quiet), (10, &noisy)].into_iter().flat_map(|(o, t)| read(&mut s, [o], t, &mut room)).collect();
        assert_eq!(reads, [Read::Oldest, Read::Handled, Read::Oldest, Read::Oldest, Read::Handled, Read::Handled, Read::Oldest], "the quiet tenant's were handled before");
        assert!(!s.active());
        assert_eq!(read(&mut s, [11], &noisy, &mut room), [Read::Pass], "nothing spilled: as any message");
        assert_eq!(read(&mut s, [8], &quiet, &mut room), [Read::Pass], "read before and handed back (it waited in a lane)");
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
        assert_eq!(s.read_again(), 10);
        assert!(!s.cut_off(12), "read again");
        assert_eq!(s.read(10, &noisy), Read::Oldest);
        s.taken(10);
        assert_eq!(s.read(11, &quiet), Read::Handled);
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
    fn spilled_messages_are_read_again_once_the_partition_was_read_to_its_end_or_after_a_while() {
        let (noisy, quiet, now) = (t("noisy"), t("quiet"), Instant::now());
        let mut s = Spill::default();
        s.read(1, &noisy);
        s.start(1, &noisy);
        s.read(2, &quiet);
        assert!(!s.due(true, now), "messages held in memory go first");
        assert!(!s.due(false, now), "not read to the end: the other tenants' messages behind come first");
        s.ended(3);
        assert!(s.due(false, now));
        assert_eq!(s.read_again(), 1);
        assert!(!s.due(false, now), "being read again");
        assert_eq!(s.read(1, &noisy), Read::Oldest);
        s.spill_again(1);
        assert_eq!(s.take_skip(), Some(3), "read on after what was read before");
        assert!(!s.due(false, now), "not read to the end since");
        assert!(s.due(false, now + CATCH_UP), "after a while all the same");
        s.clear();
        assert!(!s.due(false, now + CATCH_UP));
    }
}
