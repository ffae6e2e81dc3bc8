//! Key lanes: within a partition, a fan-out (a rename, a profile change)
//! runs a page at a time, and the other keys' commands are applied between
//! its pages instead of waiting for it. One key's commands still run one at
//! a time, in log order: those that arrive while its fan-out runs wait in
//! its lane, and go on once it is done.
//!
//! The invariant that makes this safe (docs/architecture.md): the offset
//! recorded as applied is the lowest unfinished command's predecessor
//! ([`Tracker`]), so a restart re-applies everything above it, which the
//! position guards make harmless. What is not a plain command of one key
//! (a move, an owner change, a control message, a rejection) is a
//! *barrier*: the lanes drain before it, and nothing after it starts
//! before it is done. Any failure while lanes are busy drops them and reads
//! the partition again from the checkpoint, one command at a time up to
//! where it had read.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;

use super::tracker::Tracker;
use super::*;
use crate::command::tenant;
use crate::index::Pages;

/// Messages handled at least between two pages of the fan-outs in progress
/// while more are waiting: the other keys' commands go first, the fan-outs
/// still move.
pub(super) const PAGE_EVERY: usize = 64;

/// When the next page of the fan-outs in lanes is due while other
/// messages are ready: once at least [`PAGE_EVERY`] of them were handled
/// since the last page *and* for at least as long as that page took. So
/// the fan-outs get at most half of the applier's time while other keys
/// wait, whatever a page costs: counting messages alone let a page of
/// Elasticsearch round trips (about a second on the suite's server) run
/// after every 64 messages, fewer than arrived meanwhile at 200/s, and the
/// other keys' backlog grew for the whole rename (docs/benchmark.md,
/// "Key lanes").
#[derive(Debug)]
pub(super) struct PageShare {
    handled: usize,
    since: Instant,
    last_page: Duration,
}

impl Default for PageShare {
    fn default() -> Self {
        PageShare { handled: 0, since: Instant::now(), last_page: Duration::ZERO }
    }
}

impl PageShare {
    /// A message of another key was handled (or queued in its lane).
    pub(super) fn handled(&mut self) {
        self.handled += 1;
    }

    /// Whether a page is due though messages are ready, at `now`.
    pub(super) fn due(&self, now: Instant) -> bool {
        self.handled >= PAGE_EVERY && now.saturating_duration_since(self.since) >= self.last_page
    }

    /// A page ran from `started` to `now` (`moved`: it wrote or scanned;
    /// a fan-out held by its page pause did not, and costs nothing).
    pub(super) fn paged(&mut self, started: Instant, moved: bool, now: Instant) {
        self.handled = 0;
        self.since = now;
        if moved {
            self.last_page = now.saturating_duration_since(started);
        }
    }
}

/// The fan-outs in the lanes of every partition of this process, against
/// `--max-lane-fan-outs` (review of Elasticsearch, F11). On Elasticsearch
/// each holds a point in time (which keeps the segments it read alive) and
/// up to three page bulks in flight; on the embedded index, a snapshot.
/// A partition may always run one fan-out in a lane; it starts another
/// only while the process runs fewer than the bound, and its fan-outs wait
/// at the head of its queue meanwhile, as when its own lanes are full.
/// A partition never waits for another's lanes: each one's first lane is
/// not bound, so none can hold the others up (their lanes advance only on
/// their own threads, which may be waiting for a take-over). Partitions
/// starting at once may pass the bound by a few.
#[derive(Debug, Default)]
pub(crate) struct LaneFanOuts {
    open: Arc<AtomicUsize>,
    peak: AtomicUsize,
}

impl LaneFanOuts {
    /// Fan-outs in lanes now.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// The most fan-outs in lanes at once so far.
    #[cfg(test)]
    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    fn slot(&self) -> Slot {
        let now = self.open.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        gauge!(m::LANE_FAN_OUTS).set(now as f64);
        Slot(self.open.clone())
    }
}

/// A fan-out's place in [`LaneFanOuts`], given back when its job ends
/// (completed, or dropped with the lanes).
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        let now = self.0.fetch_sub(1, Ordering::SeqCst) - 1;
        gauge!(m::LANE_FAN_OUTS).set(now as f64);
    }
}

/// A fan-out in progress in its key's lane.
pub(super) struct Job {
    /// Its place among the process's fan-outs in lanes.
    slot: Option<Slot>,
    record: Record,
    envelope: Envelope,
    pages: Pages,
    written: u64,
    started: Instant,
    started_ms: i64,
    /// `--fan-out-page-pause`: no page before this.
    next_page_at: Instant,
}

impl Job {
    pub(super) fn new(origin: &dead_letter::Origin<'_>, envelope: &Envelope, pages: Pages) -> Self {
        let record = Record { offset: origin.offset, key: origin.key.map(<[u8]>::to_vec), payload: origin.payload.map(<[u8]>::to_vec), timestamp_ms: None, signature: None };
        let now = Instant::now();
        Job { slot: None, record, envelope: envelope.clone(), pages, written: 0, started: now, started_ms: crate::clock::now_millis().max(1), next_page_at: now }
    }
}

#[derive(Default)]
struct Lane {
    job: Option<Job>,
    /// The key's messages received while its fan-out runs, in log order.
    waiting: VecDeque<Record>,
}

/// One partition's lanes.
#[derive(Default)]
pub(super) struct Lanes {
    lanes: HashMap<String, Lane>,
    /// Keys whose fan-out runs, in turn by tenant (`turn.rs`).
    turn: super::turn::Turn,
    pub(super) tracker: Tracker,
    /// A flooding tenant's messages read ahead past (`hold.rs`).
    pub(super) hold: super::hold::Hold,
    /// Its messages past the hold's bound, kept in a file (`spill.rs`).
    pub(super) spill: super::spill::Spill,
    /// The highest offset received.
    highest: i64,
    /// After a fall-back, messages up to here are handled one at a time.
    serial_until: i64,
    /// Whether the message being handled may start a fan-out in a lane
    /// (set around the loop's own handling only: never in a re-application).
    may_defer: bool,
    /// A lane's failure dropped the lanes: the partition is to be read
    /// again from the shard's checkpoint.
    fell_back: bool,
}

impl Lanes {
    pub(super) fn jobs(&self) -> usize {
        self.turn.len()
    }

    /// Whether the message about to be handled may start a fan-out in a
    /// lane: only in the loop's own handling, never in a re-application.
    pub(super) fn allow_deferring(&mut self, may: bool) {
        self.may_defer = may;
    }

    pub(super) fn may_defer(&self) -> bool {
        self.may_defer
    }

    /// Whether a lane's failure dropped the lanes since the partition was
    /// last sought.
    pub(super) fn fell_back(&self) -> bool {
        self.fell_back
    }

    /// Takes the fall-back due: the partition is sought again.
    pub(super) fn take_fall_back(&mut self) -> bool {
        std::mem::take(&mut self.fell_back)
    }

    fn busy(&self) -> bool {
        !self.turn.is_empty() || self.tracker.busy()
    }
}

/// Where a message goes while lanes are busy.
pub(super) enum Route {
    /// Handled now.
    Now,
    /// Behind its key's fan-out.
    Behind(String),
    /// Waits at the head of the queue: a barrier while lanes are busy, or a
    /// fan-out while every lane is.
    Blocked,
    /// A barrier with messages held before it (`hold.rs`): they go first.
    AfterHeld,
    /// A barrier while messages are spilled before it (`spill.rs`): it is
    /// read again after them.
    AfterSpilled,
    /// A fan-out while every lane is busy: its tenant is held (`hold.rs`)
    /// when another tenant is active, and it waits at the head otherwise.
    NoLane,
}

impl Applier {
    /// Whether the message at `offset` may use lanes.
    pub(super) fn lanes_on(&self, offset: i64) -> bool {
        let mut lanes = self.lanes.borrow_mut();
        lanes.highest = lanes.highest.max(offset);
        self.shared.cfg.lanes > 1 && offset > lanes.serial_until && !self.moving() && !self.receiving.borrow().rewind_due()
    }

    /// Whether a command is unfinished out of order (a fan-out in progress,
    /// or a message waiting behind one).
    pub(super) fn lanes_busy(&self) -> bool {
        self.lanes.borrow().busy()
    }

    /// Whether a failure with `batch` uncommitted must go back to the
    /// checkpoint rather than re-apply the batch: lanes are busy, or the
    /// batch is out of log order (a fan-out finished after later commands
    /// of other keys), so committing it one message at a time could record
    /// a command applied before an earlier one is.
    pub(super) fn must_fall_back(&self, batch: &[Record]) -> bool {
        self.lanes_busy() || !batch.windows(2).all(|w| w[0].offset() < w[1].offset())
    }

    pub(super) fn lane_jobs(&self) -> usize {
        self.lanes.borrow().jobs()
    }

    /// When the oldest fan-out in progress started (milliseconds since the
    /// epoch; 0: none).
    pub(super) fn oldest_job_ms(&self) -> i64 {
        let lanes = self.lanes.borrow();
        lanes.lanes.values().filter_map(|l| l.job.as_ref().map(|j| j.started_ms)).min().unwrap_or(0)
    }

    /// Where `msg` goes while lanes are busy.
    pub(super) fn route(&self, msg: &Record) -> Route {
        let lanes = self.lanes.borrow();
        let (key, fan_out) = match self.admitted(msg) {
            Ok(Admitted::Command(e)) if e.command.previous_key().is_none() && e.command.destination_key().is_none() => (e.command.key().to_string(), e.command.is_fan_out()),
            // A message dead-lettered as it is (undecodable, invalid,
            // oversized) is no barrier: it goes behind its key's fan-out,
            // if any, like a command of that key (its abort may park the
            // key), and is handled now otherwise. It used to wait for
            // every fan-out of the partition to end.
            Err(crate::worker::admit::NotAdmitted::Rejected(r)) if r.chunk.is_none() => (String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned(), false),
            // A barrier: after every fan-out, and the messages held before
            // it.
            _ if lanes.jobs() > 0 => return Route::Blocked,
            _ if lanes.spill.before(msg.offset()) => return Route::AfterSpilled,
            _ if lanes.hold.holds_before(msg.offset()) => return Route::AfterHeld,
            _ => return Route::Now,
        };
        if lanes.lanes.contains_key(&key) {
            Route::Behind(key)
        } else if fan_out && !self.lane_free_for(&lanes, &tenant::of(&key).map(str::to_string), Instant::now()) {
            Route::NoLane
        } else {
            Route::Now
        }
    }

    /// Whether a fan-out may start in a lane now: one is free in the
    /// partition, and the process runs fewer than its bound (a partition
    /// may always run one).
    pub(super) fn lane_free(&self) -> bool {
        Self::free(&self.shared, &self.lanes.borrow())
    }

    fn free(shared: &Shared, lanes: &Lanes) -> bool {
        lanes.jobs() < shared.cfg.lanes && (lanes.jobs() == 0 || shared.lane_fan_outs.open() < shared.cfg.max_lane_fan_outs)
    }

    /// [`Applier::lane_free`] for a fan-out of tenant `t`, within its
    /// share: while another tenant was active lately (`hold.rs`), one
    /// tenant takes at most all the lanes but one (issue 47: one tenant's
    /// renames took every lane, and the others' fan-outs waited for them).
    /// Not with `--tenant-read-ahead false`, nor with one lane.
    fn lane_free_for(&self, lanes: &Lanes, t: &Option<String>, now: Instant) -> bool {
        let cfg = &self.shared.cfg;
        let over_share = cfg.tenant_read_ahead && cfg.lanes > 1 && lanes.turn.of_tenant(t.as_deref()) + 1 >= cfg.lanes && lanes.hold.others_active(t, now);
        Self::free(&self.shared, lanes) && !over_share
    }

    /// Whether held messages may be released: unless the held tenant's
    /// first is a fan-out that found no lane for it (every lane busy, or
    /// its tenant's share taken) and none is free for it yet.
    pub(super) fn may_release(&self) -> bool {
        let lanes = self.lanes.borrow();
        let Some(held) = lanes.hold.held_tenant().filter(|_| lanes.hold.waits_for_lane()) else { return true };
        self.lane_free_for(&lanes, held, Instant::now())
    }

    /// `msg` waits behind its key's fan-out; it stays counted as queued.
    pub(super) fn wait_in_lane(&self, key: String, msg: Record) {
        self.trace(msg.offset(), "waits in its lane");
        self.queued.add(queued_size(&msg));
        let mut lanes = self.lanes.borrow_mut();
        lanes.tracker.defer(msg.offset());
        lanes.lanes.entry(key).or_default().waiting.push_back(msg);
    }

    /// A fan-out [`Applier::command`] started in its key's lane.
    pub(super) fn start_lane(&self, mut job: Box<Job>) {
        job.slot = Some(self.shared.lane_fan_outs.slot());
        let mut lanes = self.lanes.borrow_mut();
        let key = job.envelope.command.key().to_string();
        lanes.tracker.defer(job.record.offset());
        lanes.turn.push(key.clone());
        let lane = lanes.lanes.entry(key).or_default();
        debug_assert!(lane.job.is_none(), "one fan-out per lane");
        lane.job = Some(*job);
        gauge!(m::PARTITION_BUSY_LANES, "partition" => self.partition.to_string()).set(lanes.jobs() as f64);
    }

    /// Runs one page of the next fan-out in turn (the tenants in turn,
    /// then each one's keys: `turn.rs`). A fan-out that completes
    /// is committed on its own when it is large ([`Applier::commits_alone`])
    /// and joins the batch otherwise; its key's waiting messages go back to
    /// the head of `ahead`, in order. A failure drops the lanes and reads the
    /// partition again from the checkpoint ([`Applier::fall_back`]).
    /// Whether a page was run.
    pub(super) fn run_page(&self, shard: &mut ShardBox, batch: &mut Vec<Record>, ahead: &mut VecDeque<Feed>) -> Step<bool> {
        let (key, mut job) = {
            let mut lanes = self.lanes.borrow_mut();
            let Some(key) = lanes.turn.next() else { return Ok(false) };
            let job = lanes.lanes.get_mut(&key).and_then(|l| l.job.take()).expect("a lane in turn has its fan-out");
            (key, job)
        };
        let cmd = &job.envelope.command;
        let held = crate::faults::lists("fanout.hold", cmd.key()) && {
            crate::faults::reached("fanout.hold");
            true
        };
        let ran = !held && Instant::now() >= job.next_page_at;
        // The documents written, once the fan-out is complete.
        let step: Result<Option<u64>, IndexError> = match ran {
            false => Ok(None),
            true => {
                let pos = job.record.offset() as u64;
                let injected = crate::faults::lists("fanout.page-fail", cmd.key()).then(|| {
                    crate::faults::reached("fanout.page-fail");
                    IndexError::Backend("injected fault fanout.page-fail".into())
                });
                let page = match injected {
                    Some(e) => Err(e),
                    None => Ok(()),
                };
                page.and_then(|()| {
                    shard.rewrite_page(&mut job.pages, &mut |d| crate::apply::fan_out_rule(cmd, pos, d)).and_then(|(n, done)| {
                        job.written += n;
                        let pause = self.shared.cfg.fan_out.page_pause;
                        if !pause.is_zero() {
                            job.next_page_at = Instant::now() + pause;
                        }
                        match done {
                            true => crate::apply::fan_out_finish(shard.as_mut(), cmd, pos).map(|n| Some(job.written + n)),
                            false => Ok(None),
                        }
                    })
                })
            }
        };
        match step {
            Err(e) => {
                // Its lane goes with the others (its waiting messages
                // leave the queue's count there).
                // The batch goes too: the writer failed, and nothing it
                // holds may be committed, not even by a stop during the
                // backoff (review of lanes, F10).
                self.fall_back_from(shard, batch, &format_args!("a fan-out's page at offset {}: {e}", job.record.offset()))?;
                Ok(true)
            }
            Ok(None) => {
                let mut lanes = self.lanes.borrow_mut();
                lanes.turn.push(key.clone());
                lanes.lanes.get_mut(&key).expect("its lane").job = Some(job);
                Ok(ran)
            }
            Ok(Some(docs)) => {
                self.finished(shard, batch, ahead, key, job, docs)?;
                Ok(true)
            }
        }
    }

    /// A fan-out of a lane completed.
    fn finished(&self, shard: &mut ShardBox, batch: &mut Vec<Record>, ahead: &mut VecDeque<Feed>, key: String, job: Job, docs: u64) -> Step<()> {
        let (cmd, pos) = (&job.envelope.command, job.record.offset());
        let elapsed = job.started.elapsed();
        histogram!(m::COMMAND_DOCUMENTS, "type" => cmd.kind()).record(docs as f64);
        histogram!(m::COMMAND_SECONDS, "type" => cmd.kind()).record(elapsed.as_secs_f64());
        count(cmd.kind(), outcome::APPLIED);
        m::tenants::applied(cmd.tenant(), Some(docs), job.envelope.issued_at);
        self.shared.stats.record(docs, true, elapsed);
        self.trace(pos, super::APPLIED);
        #[cfg(test)]
        self.shared.stats.lane_fan_outs_finished.lock().expect("finished lock").push(pos);
        let alone = self.commits_alone(docs);
        match alone {
            true => info!(partition = self.partition, offset = pos, command = cmd.kind(), documents = docs, ms = elapsed.as_millis() as u64, lane = %tenant::Shown(&key), "fan-out applied"),
            false => debug!(partition = self.partition, offset = pos, command = cmd.kind(), documents = docs, ms = elapsed.as_millis() as u64, lane = %tenant::Shown(&key), "fan-out applied"),
        }
        let waiting = {
            let mut lanes = self.lanes.borrow_mut();
            let lane = lanes.lanes.remove(&key).expect("its lane");
            gauge!(m::PARTITION_BUSY_LANES, "partition" => self.partition.to_string()).set(lanes.jobs() as f64);
            lane.waiting
        };
        // Handled next, before anything received after them.
        waiting.iter().for_each(|m| self.trace(m.offset(), "back from its lane"));
        super::hold::put_back(ahead, waiting);
        self.mark(shard.as_mut(), &job.record);
        batch.push(job.record);
        match alone {
            true => self.commit(shard, batch),
            // Committed with the batch it joins (the loop gives the batch
            // its deadline).
            false => Ok(()),
        }
    }

    /// Whether a fan-out that wrote `docs` documents is committed on its
    /// own, at once, rather than with the batch it joins: one of a page or
    /// more (its effects are then visible at once, and what it left
    /// uncommitted bounded). A small fan-out (a profile change's few
    /// posts) costs what its writes cost.
    pub(super) fn commits_alone(&self, docs: u64) -> bool {
        docs as usize >= self.shared.cfg.fan_out.page_size
    }

    /// A failure while lanes are busy: the lanes are dropped, the shard
    /// reopened at its last commit, and the partition read again from its
    /// checkpoint (the lowest unfinished command's predecessor), one
    /// command at a time up to the highest offset received, where the
    /// usual retries, isolation and dead letters deal with the failure.
    pub(super) fn fall_back(&self, shard: &mut ShardBox, why: &dyn std::fmt::Display) -> Step<()> {
        self.clear_lanes();
        let until = {
            let mut lanes = self.lanes.borrow_mut();
            lanes.serial_until = lanes.highest;
            lanes.serial_until
        };
        warn!(partition = self.partition, error = %why, until, "a failure while key lanes were busy: the partition is read again from the shard's checkpoint, one command at a time up to the offset received");
        // The end the consumer reported was of the reading before: it is
        // reported again once the partition is read to its end from the
        // checkpoint (published meanwhile, it would pass what is read
        // again). Forgotten before the backoff: a stop during it publishes
        // what is committed, and the end published then passed the
        // unfinished fan-outs (review of lanes, F10).
        self.publication.borrow_mut().forget_end();
        crate::faults::hold("lanes.fall-back");
        self.retrying(Op::Apply).failed(why)?;
        self.reopen(shard, &[])?;
        self.lanes.borrow_mut().fell_back = true;
        Ok(())
    }

    /// [`Applier::fall_back`] from a failure with `batch` uncommitted:
    /// the batch is read again with the rest.
    pub(super) fn fall_back_from(&self, shard: &mut ShardBox, batch: &mut Vec<Record>, why: &dyn std::fmt::Display) -> Step<()> {
        batch.clear();
        self.fall_back(shard, why)
    }

    /// Drops the lanes without a failure (the partition is positioned anew:
    /// a new generation, a seek).
    pub(super) fn clear_lanes(&self) {
        self.drop_held();
        let mut lanes = self.lanes.borrow_mut();
        for lane in lanes.lanes.values() {
            for msg in &lane.waiting {
                self.queued.take(queued_size(msg));
            }
        }
        lanes.lanes.clear();
        lanes.turn.clear();
        lanes.tracker.reset();
        gauge!(m::PARTITION_BUSY_LANES, "partition" => self.partition.to_string()).set(0.0);
    }
}
