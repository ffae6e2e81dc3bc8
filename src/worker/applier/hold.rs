//! Reading ahead past one tenant's flood (issue 47). When a partition's
//! queue is deep (at least [`DEEP`] messages) and one tenant sent most of
//! what was read lately, while another tenant was active too, that
//! tenant's messages are *held*: taken out of the way in memory, in log
//! order, so that the other tenants' messages behind them are applied as
//! soon as they are read. A tenant is held too from a fan-out of its own
//! that finds every key lane busy ([`Hold::holds_for_lane`]), rather than
//! that fan-out waiting at the head of the queue, where it held every
//! tenant up. The held messages are released, oldest first, in chunks:
//! whenever nothing else is ready, after every [`RELEASE_EVERY`] other
//! messages, and all of those before a message that must keep its place in
//! the whole partition's order (a barrier: a move, an owner change, a
//! control message).
//!
//! Per-key order holds: a key belongs to one tenant, and a held tenant's
//! messages keep their order in the hold. The tracker counts each held
//! message unfinished, so the offset recorded as applied stays below it.
//! Held messages stay counted against `--queue-kb` (the consumer pauses
//! the partition when it is reached): the read-ahead is bounded by it. No
//! I/O here.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::{queued_size, spill, Applier, Feed, Record};
use crate::command::tenant;

/// The messages read lately, over which a tenant's share is counted.
pub(super) const WINDOW: usize = 256;

/// A tenant sending at least this share of [`WINDOW`] is held.
const SHARE_NUM: usize = 3;
const SHARE_DEN: usize = 4;

/// Messages queued for the applier from which its queue counts as deep:
/// the partition is behind by a backlog worth reading ahead past. (Half of
/// `--queue-kb` was the first measure: a larger queue then never counted
/// as deep under a backlog it could hold whole, and nothing was held.)
pub(super) const DEEP: usize = 4 * WINDOW;

/// Another tenant sent a message this recently: holding is worth it.
pub(super) const OTHERS_ACTIVE: Duration = Duration::from_secs(30);

/// Messages released at a time, and other messages handled between two
/// releases while they keep coming.
pub(super) const RELEASE_EVERY: usize = 256;

/// Distinct tenants remembered as active.
const REMEMBERED: usize = 64;

type Tenant = Option<String>;

/// The tenant of a message, from its key (`<tenant>\x1f<key>`). Read
/// before the message is admitted: a prefix that is no valid tenant id
/// (of any length a producer chose) is one bucket, [`NOT_A_TENANT`], so
/// that what the read-ahead remembers is bounded by the tenant ids' size.
pub(super) fn tenant_of(msg: &Record) -> Option<&str> {
    let t = tenant::of_key(msg.key())?;
    Some(if tenant::validate(t).is_ok() { t } else { NOT_A_TENANT })
}

/// The bucket of every key prefix that is no valid tenant id (no tenant
/// id has `<`).
pub(super) const NOT_A_TENANT: &str = "<not a tenant>";

/// See the module's doc.
#[derive(Debug, Default)]
pub(super) struct Hold {
    /// The tenant held, while one is.
    tenant: Option<Tenant>,
    held: VecDeque<Record>,
    /// What the held messages count against `--queue-kb`.
    bytes: usize,
    /// The highest offset released: a message at or below it was held
    /// before, and is not held again.
    released_through: Option<i64>,
    /// The tenants of the last [`WINDOW`] messages read, and their counts.
    window: VecDeque<Tenant>,
    counts: HashMap<Tenant, usize>,
    /// The tenants seen lately, and when.
    active: Vec<(Tenant, Instant)>,
    /// Other messages handled since the last release.
    since_release: usize,
    /// The held tenant's first held message is a fan-out that found every
    /// lane busy ([`Hold::holds_for_lane`]): nothing is released before a
    /// lane is free.
    waits_for_lane: bool,
    /// The highest offset counted in the window: a message taken again
    /// (one waiting at the head of the queue is taken at every turn of the
    /// loop) is counted once.
    observed_through: Option<i64>,
    /// A hold started since [`Hold::take_started`] last looked.
    started: bool,
    /// The tenant whose hold was last reported, and when.
    reported: Option<(Tenant, Instant)>,
}

/// A hold of the tenant last reported is reported again after this long.
const REPORT_EVERY: Duration = Duration::from_secs(60);

impl Hold {
    /// Held messages.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// What the held messages count against `--queue-kb`.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether a message of `t` may be held beside what is held: none is,
    /// or its tenant's.
    pub fn may_keep(&self, t: &Tenant) -> bool {
        self.tenant.as_ref().is_none_or(|h| h == t)
    }

    /// Holds `t`'s messages from now on (a spilled message taken back is
    /// held whatever the window says).
    pub fn keep(&mut self, t: Tenant) {
        self.tenant = Some(t);
    }

    /// Whether the message at `offset` was held and released: it is never
    /// held (nor spilled) again.
    pub fn released(&self, offset: i64) -> bool {
        self.released_through.is_some_and(|r| offset <= r)
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// [`Hold::holds_of`], the tenant read from `msg`'s key.
    #[cfg(test)]
    pub fn holds(&mut self, msg: &Record, deep: bool, now: Instant) -> bool {
        self.holds_of(msg.offset(), &tenant_of(msg).map(str::to_string), deep, now)
    }

    /// Whether the message at `offset`, of tenant `t` (read once from its
    /// key by the caller), read now with the queue `deep` (see [`DEEP`]),
    /// is held. Call it for every message the loop takes, in order: a
    /// message released before is never held again. It starts holding its
    /// tenant when that tenant sent at least three quarters of the last
    /// [`WINDOW`] messages and another tenant was active within
    /// [`OTHERS_ACTIVE`].
    pub fn holds_of(&mut self, offset: i64, t: &Tenant, deep: bool, now: Instant) -> bool {
        if self.released_through.is_some_and(|r| offset <= r) {
            return false;
        }
        if self.observed_through.is_none_or(|o| offset > o) {
            self.observed_through = Some(offset);
            self.observe(t, now);
        }
        let hold = match &self.tenant {
            Some(held) => held == t,
            None => {
                let start = deep && self.dominant(t) && self.others_active(t, now);
                self.started |= start;
                start
            }
        };
        if hold {
            if self.tenant.is_none() {
                self.tenant = Some(t.clone());
            }
        } else {
            self.since_release += 1;
        }
        hold
    }

    /// Whether `msg`, a fan-out that finds every lane of the partition
    /// busy, is held instead of waiting at the head of the queue (where it
    /// would hold every tenant up): while no other tenant is held, and
    /// another tenant was active within [`OTHERS_ACTIVE`]. Its tenant is
    /// held from then on, and nothing is released before a lane is free.
    /// A fan-out released before and blocked again is held again, and so
    /// are its tenant's messages released after it.
    pub fn holds_for_lane(&mut self, msg: &Record, now: Instant) -> bool {
        let t = tenant_of(msg).map(str::to_string);
        let hold = match &self.tenant {
            Some(held) => *held == t,
            None => self.others_active(&t, now),
        };
        if hold {
            self.tenant = Some(t);
            self.waits_for_lane = true;
            if self.released_through.is_some_and(|r| msg.offset() <= r) {
                self.released_through = Some(msg.offset() - 1);
            }
        }
        hold
    }

    /// The tenant held, when a hold started since the last call and is
    /// worth reporting: another tenant than the last reported, or the same
    /// after [`REPORT_EVERY`] (a hold stops each time it is released
    /// whole, and starts again while the flood lasts).
    pub fn take_started(&mut self, now: Instant) -> Option<Tenant> {
        if !std::mem::take(&mut self.started) {
            return None;
        }
        let t = self.tenant.clone()?;
        let again = self.reported.as_ref().is_some_and(|(r, at)| *r == t && now.saturating_duration_since(*at) < REPORT_EVERY);
        if again {
            return None;
        }
        self.reported = Some((t.clone(), now));
        Some(t)
    }

    /// Whether nothing may be released before a lane is free.
    pub fn waits_for_lane(&self) -> bool {
        self.waits_for_lane && !self.held.is_empty()
    }

    /// Holds `msg` (after [`Hold::holds_of`] said so), in offset order.
    pub fn push(&mut self, msg: Record) {
        self.bytes += queued_size(&msg);
        match self.held.back().is_none_or(|b| b.offset() < msg.offset()) {
            true => self.held.push_back(msg),
            false => {
                let at = self.held.partition_point(|m| m.offset() < msg.offset());
                self.held.insert(at, msg);
            }
        }
    }

    /// Whether held messages are due for release while other messages
    /// keep coming.
    pub fn release_due(&self) -> bool {
        !self.held.is_empty() && self.since_release >= RELEASE_EVERY
    }

    /// Releases the oldest [`RELEASE_EVERY`] held messages, in order.
    pub fn release(&mut self) -> Vec<Record> {
        let n = self.held.len().min(RELEASE_EVERY);
        self.take(n)
    }

    /// Releases the held messages before `offset`, in order.
    pub fn release_before(&mut self, offset: i64) -> Vec<Record> {
        let n = self.held.partition_point(|m| m.offset() < offset);
        self.take(n)
    }

    /// Whether a message is held before `offset`.
    pub fn holds_before(&self, offset: i64) -> bool {
        self.held.front().is_some_and(|m| m.offset() < offset)
    }

    /// Drops everything held (the partition is read again from the
    /// checkpoint, which is below it): the messages dropped.
    pub fn clear(&mut self) -> VecDeque<Record> {
        self.tenant = None;
        self.released_through = None;
        self.since_release = 0;
        self.waits_for_lane = false;
        self.observed_through = None;
        self.bytes = 0;
        std::mem::take(&mut self.held)
    }

    fn take(&mut self, n: usize) -> Vec<Record> {
        let out: Vec<Record> = self.held.drain(..n).collect();
        self.bytes -= out.iter().map(queued_size).sum::<usize>();
        if let Some(last) = out.last() {
            self.released_through = Some(last.offset());
        }
        self.since_release = 0;
        // A lane was free: the fan-out at the head takes it (blocked again,
        // it is held again).
        self.waits_for_lane = false;
        if self.held.is_empty() {
            // Holding starts again only when it is due again.
            self.tenant = None;
        }
        out
    }

    fn observe(&mut self, t: &Tenant, now: Instant) {
        self.window.push_back(t.clone());
        *self.counts.entry(t.clone()).or_default() += 1;
        if self.window.len() > WINDOW {
            let out = self.window.pop_front().expect("over the window");
            if let Some(c) = self.counts.get_mut(&out) {
                *c -= 1;
                if *c == 0 {
                    self.counts.remove(&out);
                }
            }
        }
        match self.active.iter_mut().find(|(a, _)| a == t) {
            Some(entry) => entry.1 = now,
            None => {
                if self.active.len() >= REMEMBERED {
                    // The least recently seen goes.
                    let oldest = self.active.iter().enumerate().min_by_key(|(_, (_, at))| *at).map(|(i, _)| i).expect("not empty");
                    self.active.swap_remove(oldest);
                }
                self.active.push((t.clone(), now));
            }
        }
    }

    fn dominant(&self, t: &Tenant) -> bool {
        self.window.len() >= WINDOW && self.counts.get(t).copied().unwrap_or(0) * SHARE_DEN >= self.window.len() * SHARE_NUM
    }

    /// The tenant held, while one is.
    pub fn held_tenant(&self) -> Option<&Tenant> {
        self.tenant.as_ref()
    }

    /// Whether a tenant other than `t` was active within [`OTHERS_ACTIVE`].
    pub fn others_active(&self, t: &Tenant, now: Instant) -> bool {
        self.active.iter().any(|(a, at)| a != t && now.saturating_duration_since(*at) <= OTHERS_ACTIVE)
    }
}

impl Applier {
    /// Whether `msg` is of a tenant other than the one whose messages are
    /// held back (held or spilled), while one's are: its batch is
    /// committed within `--tenant-commit-ms` (`triggers.rs`).
    pub(super) fn beside_a_flood(&self, msg: &Record) -> bool {
        if !self.shared.cfg.tenant_read_ahead {
            return false;
        }
        let lanes = self.lanes.borrow();
        lanes.hold.held_tenant().or(lanes.spill.tenant()).is_some_and(|t| t.as_deref() != tenant_of(msg))
    }

    /// Whether `msg`, just taken by the loop, is held ([`Hold::holds_of`];
    /// never when it may not be): then it is held, counted as queued
    /// again and unfinished, or spilled past the hold's bound (`spill.rs`);
    /// one of the spilled tenant that finds the spill file full goes back
    /// to the head of `ahead`, behind spilled messages taken back. Otherwise
    /// it is handed back.
    pub(super) fn held(&self, msg: Record, may: bool, ahead: &mut VecDeque<Feed>) -> Option<Record> {
        // Switched off: nothing to count either (the loop's hot path).
        if !self.shared.cfg.tenant_read_ahead {
            return Some(msg);
        }
        let (offset, t) = (msg.offset(), tenant_of(&msg).map(str::to_string));
        let read = {
            let mut lanes = self.lanes.borrow_mut();
            match lanes.hold.released(offset) {
                true => spill::Read::Again,
                false => lanes.spill.read(offset, &t, self.shared.cfg.spill_bytes),
            }
        };
        match read {
            spill::Read::Pass | spill::Read::Again => {}
            spill::Read::Behind => {
                self.spilled(&msg, &t);
                return None;
            }
            spill::Read::Full => {
                #[cfg(test)]
                self.shared.stats.spill_full.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                self.after_spilled(msg, ahead);
                return None;
            }
        }
        // A hold is never active when a message may not be held (the first
        // after positioning: every hold was dropped with the seek), nor
        // starts while another tenant's messages are spilled.
        let spilling = self.lanes.borrow().spill.active();
        let deep = may && !spilling && self.queued.messages() >= DEEP;
        let now = Instant::now();
        let started = {
            let mut lanes = self.lanes.borrow_mut();
            if !lanes.hold.holds_of(offset, &t, deep, now) {
                return Some(msg);
            }
            lanes.hold.take_started(now)
        };
        if let Some(tenant) = started {
            info!(
                partition = self.partition,
                tenant = tenant.as_deref().unwrap_or("(default)"),
                offset = msg.offset(),
                queued = self.queued.messages(),
                "reading ahead past this tenant's flood: its messages are held, the other tenants' behind them applied first (said again after a minute)"
            );
        }
        // Past the bound, the held tenant's messages read for the first
        // time are spilled (a tenant held for a lane while another is
        // spilled stays in memory). One read before and held again stays in
        // memory, where it was already: messages read after it may be held
        // now, and it must come before them.
        let full = {
            let lanes = self.lanes.borrow();
            read == spill::Read::Pass && !spilling && !self.room(&lanes.hold, &msg)
        };
        if full {
            let report = self.lanes.borrow_mut().spill.report(now);
            if report {
                info!(
                    partition = self.partition,
                    tenant = t.as_deref().unwrap_or("(default)"),
                    offset,
                    held = self.held_len(),
                    "the flood is larger than the hold: this tenant's later messages are read past, kept in a file, and taken back as the held ones are applied (said again after a minute)"
                );
            }
            self.spilled(&msg, &t);
        } else {
            self.hold_now(msg);
        }
        None
    }

    /// Whether the hold has room for `msg` (an empty hold always has).
    fn room(&self, hold: &Hold, msg: &Record) -> bool {
        hold.is_empty() || hold.bytes() + queued_size(msg) <= spill::Spill::bound(self.shared.cfg.queue_bytes)
    }

    /// Whether `msg`, a fan-out that finds every lane busy, is held
    /// ([`Hold::holds_for_lane`]); then it is.
    pub(super) fn held_for_lane(&self, msg: Record) -> Option<Record> {
        if !self.shared.cfg.tenant_read_ahead || !self.lanes.borrow_mut().hold.holds_for_lane(&msg, Instant::now()) {
            return Some(msg);
        }
        self.hold_now(msg);
        None
    }

    /// Holds `msg`: counted as queued again, and unfinished.
    pub(super) fn hold_now(&self, msg: Record) {
        self.trace(msg.offset(), "held");
        let mut lanes = self.lanes.borrow_mut();
        self.queued.add(queued_size(&msg));
        lanes.tracker.defer(msg.offset());
        lanes.hold.push(msg);
        self.held_gauge(lanes.hold.len());
        #[cfg(test)]
        self.shared.stats.held_peak.fetch_max(lanes.hold.len() as u64, std::sync::atomic::Ordering::SeqCst);
    }

    /// Releases held messages to the head of `ahead` (they come before
    /// anything there): before `offset` (a barrier there), or the next
    /// chunk.
    pub(super) fn release(&self, ahead: &mut VecDeque<Feed>, before: Option<i64>) {
        let (released, left) = {
            let mut lanes = self.lanes.borrow_mut();
            let released = match before {
                Some(offset) => lanes.hold.release_before(offset),
                None => lanes.hold.release(),
            };
            (released, lanes.hold.len())
        };
        released.iter().for_each(|m| self.trace(m.offset(), "released"));
        put_back(ahead, released);
        self.held_gauge(left);
    }

    /// Held messages.
    pub(super) fn held_len(&self) -> usize {
        self.lanes.borrow().hold.len()
    }

    /// Whether held messages are due for release while others keep coming.
    pub(super) fn release_due(&self) -> bool {
        self.lanes.borrow().hold.release_due()
    }

    /// Drops what is held and what is spilled (the partition is read again
    /// from the checkpoint, below both).
    pub(super) fn drop_held(&self) {
        let (spilled, cleared) = {
            let mut lanes = self.lanes.borrow_mut();
            (lanes.spill.active(), lanes.spill.clear())
        };
        if let Err(e) = cleared {
            warn!(partition = self.partition, error = %e, "emptying the file of spilled messages failed");
        }
        if spilled {
            self.spilled_gauge(0);
        }
        let dropped = self.lanes.borrow_mut().hold.clear();
        for msg in &dropped {
            self.queued.take(queued_size(msg));
        }
        if !dropped.is_empty() {
            self.held_gauge(0);
        }
    }

    fn held_gauge(&self, n: usize) {
        self.held_messages.set(n as f64);
    }
}

/// Puts `messages` (in offset order) back at the head of `ahead`, each
/// after the messages there of lower offsets: held messages released come
/// after a lane's waiting messages handed back before them (older, and of
/// the same keys), and before whatever was received after them.
pub(super) fn put_back(ahead: &mut VecDeque<Feed>, messages: impl IntoIterator<Item = Record>) {
    let mut rest = std::mem::take(ahead);
    for msg in messages {
        while let Some(Feed::Message(m)) = rest.front() {
            if m.offset() >= msg.offset() {
                break;
            }
            ahead.push_back(rest.pop_front().expect("a front"));
        }
        ahead.push_back(Feed::Message(msg));
    }
    ahead.append(&mut rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(offset: i64, tenant: Option<&str>) -> Record {
        Record { offset, key: Some(tenant::scope(tenant, "/k").into_bytes()), payload: None, timestamp_ms: None, signature: None }
    }

    /// Reads `n` messages of `tenant` from `from` on; the offsets held.
    fn read(h: &mut Hold, from: i64, n: i64, tenant: Option<&str>, deep: bool, now: Instant) -> Vec<i64> {
        let mut held = Vec::new();
        for o in from..from + n {
            let m = msg(o, tenant);
            if h.holds(&m, deep, now) {
                held.push(o);
                h.push(m);
            }
        }
        held
    }

    /// A lane's waiting messages handed back to `ahead` come before held
    /// messages released after them: they are older, of the same keys (a
    /// post's earlier upsert behind its author's profile change, its later
    /// one held).
    #[test]
    fn released_messages_go_after_the_older_messages_at_the_head() {
        let mut ahead: VecDeque<Feed> = [150, 160].into_iter().map(|o| Feed::Message(msg(o, Some("t")))).collect();
        ahead.push_back(Feed::End(401));
        ahead.push_back(Feed::Message(msg(400, None)));
        put_back(&mut ahead, [300, 310].map(|o| msg(o, Some("t"))));
        let order: Vec<String> = ahead
            .iter()
            .map(|f| match f {
                Feed::Message(m) => m.offset().to_string(),
                Feed::End(at) => format!("end {at}"),
                Feed::Positioned(_) => "positioned".into(),
            })
            .collect();
        assert_eq!(order, ["150", "160", "300", "310", "end 401", "400"]);
        let mut empty = VecDeque::new();
        put_back(&mut empty, [msg(5, None), msg(7, None)]);
        assert_eq!(empty.iter().filter_map(|f| if let Feed::Message(m) = f { Some(m.offset()) } else { None }).collect::<Vec<_>>(), [5, 7]);
    }

    /// Key prefixes are read before admission: 256 messages keyed by a
    /// megabyte of letters before the separator cost the read-ahead no
    /// copy of them (they are one bucket, not a tenant).
    #[test]
    fn key_prefixes_that_are_no_tenant_cost_the_read_ahead_nothing() {
        let now = Instant::now();
        let (_, before, peak) = crate::alloc::peak_anon_during(|| {
            let mut h = Hold::default();
            for o in 0..256 {
                h.holds(&Record { offset: o, key: Some(format!("{}{o}\u{1f}/k", "t".repeat(1 << 20)).into_bytes()), payload: None, timestamp_ms: None, signature: None }, false, now);
            }
            h
        });
        assert!(peak.saturating_sub(before) < 16 << 10, "the read-ahead grew by {} KiB", peak.saturating_sub(before));
        let m = Record { offset: 0, key: Some(b"Not-A-Tenant\x1f/k".to_vec()), payload: None, timestamp_ms: None, signature: None };
        assert_eq!(tenant_of(&m), Some(NOT_A_TENANT));
        assert_eq!(tenant_of(&msg(1, Some("acme"))), Some("acme"));
        assert_eq!(tenant_of(&msg(1, None)), None);
    }

    #[test]
    fn a_tenant_sending_most_of_a_deep_queue_is_held_once_another_was_active() {
        let now = Instant::now();
        let mut h = Hold::default();
        assert!(read(&mut h, 0, 1, Some("quiet"), true, now).is_empty());
        let held = read(&mut h, 1, 1000, Some("noisy"), true, now);
        // Held from the message that made the window full of it.
        assert_eq!(held.first(), Some(&(WINDOW as i64 - 1)), "held from where the window filled");
        assert_eq!(held.len(), 1000 - WINDOW + 2);
        assert!(read(&mut h, 1001, 1, Some("quiet"), true, now).is_empty(), "the other tenant is not held");
        assert_eq!(h.len(), held.len());
    }

    #[test]
    fn nothing_is_held_alone_or_with_a_shallow_queue_or_without_a_dominant_tenant() {
        let now = Instant::now();
        let mut alone = Hold::default();
        assert!(read(&mut alone, 0, 1000, Some("noisy"), true, now).is_empty(), "no other tenant: holding gains nothing");
        let mut shallow = Hold::default();
        read(&mut shallow, 0, 1, None, false, now);
        assert!(read(&mut shallow, 1, 1000, Some("noisy"), false, now).is_empty(), "the queue is not deep");
        let mut mixed = Hold::default();
        for o in 0..1000 {
            let t = if o % 3 == 0 { "a" } else { "b" };
            assert!(!mixed.holds(&msg(o, Some(t)), true, now), "b sends two thirds: not held");
        }
        let mut stale = Hold::default();
        read(&mut stale, 0, 1, Some("quiet"), true, now);
        assert!(read(&mut stale, 1, 1000, Some("noisy"), true, now + OTHERS_ACTIVE + Duration::from_secs(1)).is_empty(), "the other tenant went quiet long ago");
    }

    /// A hold after the default tenant's message at 0 and `noisy`'s `n`
    /// from 1 on: the hold, the offsets held, and the time of it all.
    fn flooded(n: i64) -> (Hold, Vec<i64>, Instant) {
        let now = Instant::now();
        let mut h = Hold::default();
        read(&mut h, 0, 1, None, true, now);
        let held = read(&mut h, 1, n, Some("noisy"), true, now);
        (h, held, now)
    }

    #[test]
    fn held_messages_are_released_in_order_in_chunks_and_never_held_again() {
        let (mut h, held, now) = flooded(1000);
        assert!(!h.release_due(), "no other message handled yet");
        read(&mut h, 1001, RELEASE_EVERY as i64, None, true, now);
        assert!(h.release_due());
        let first: Vec<i64> = h.release().iter().map(Record::offset).collect();
        assert_eq!(first, held[..RELEASE_EVERY]);
        assert!(!h.release_due());
        // Released messages come back through the loop: not held again.
        assert!(!h.holds(&msg(first[0], Some("noisy")), true, now));
        // A barrier at 2000: everything held before it is released.
        assert!(h.holds_before(2000));
        let rest: Vec<i64> = h.release_before(2000).iter().map(Record::offset).collect();
        assert_eq!(rest, held[RELEASE_EVERY..]);
        assert!(h.is_empty() && !h.holds_before(i64::MAX));
        // Holding stopped with the hold empty; it starts again when due.
        assert!(!read(&mut h, 2000, 300, Some("noisy"), true, now).is_empty(), "dominant again");
        assert!(!h.clear().is_empty());
        assert!(h.is_empty());
    }

    #[test]
    fn a_fan_out_without_a_lane_holds_its_tenant_while_another_is_active_and_waits_for_a_lane() {
        let now = Instant::now();
        let mut alone = Hold::default();
        read(&mut alone, 0, 1, Some("acme"), false, now);
        assert!(!alone.holds_for_lane(&msg(1, Some("acme")), now), "no other tenant: it waits at the head as before");
        let mut h = Hold::default();
        read(&mut h, 0, 1, Some("globex"), false, now);
        assert!(h.holds_for_lane(&msg(1, Some("acme")), now));
        h.push(msg(1, Some("acme")));
        assert!(h.waits_for_lane());
        assert!(h.holds(&msg(2, Some("acme")), false, now), "its tenant's later messages are held behind it");
        h.push(msg(2, Some("acme")));
        assert!(!h.holds(&msg(3, Some("globex")), false, now));
        assert!(!h.holds_for_lane(&msg(4, Some("globex")), now), "one tenant held at a time");
        // A lane is free: released; the fan-out is blocked again.
        let released: Vec<i64> = h.release().iter().map(Record::offset).collect();
        assert_eq!(released, [1, 2]);
        assert!(!h.waits_for_lane());
        assert!(h.holds_for_lane(&msg(1, Some("acme")), now), "held again");
        h.push(msg(1, Some("acme")));
        assert!(h.holds(&msg(2, Some("acme")), false, now), "what was released after it is held again behind it");
    }

    #[test]
    fn a_message_taken_again_counts_once_in_the_window() {
        let now = Instant::now();
        let mut h = Hold::default();
        read(&mut h, 0, 1, Some("quiet"), true, now);
        read(&mut h, 1, 100, Some("noisy"), true, now);
        // The quiet tenant's message waits at the head, taken 1,000 times.
        for _ in 0..1000 {
            assert!(!h.holds(&msg(101, Some("quiet")), true, now));
        }
        assert!(!h.dominant(&Some("quiet".into())), "counted once, not a thousand times");
        assert_eq!(h.window.len(), 102);
    }

    #[test]
    fn release_before_keeps_what_comes_after() {
        let (mut h, held, _) = flooded(600);
        let at = held[10];
        let before: Vec<i64> = h.release_before(at).iter().map(Record::offset).collect();
        assert_eq!(before, held[..10]);
        assert_eq!(h.len(), held.len() - 10);
        assert!(!h.holds_before(at));
    }
}
