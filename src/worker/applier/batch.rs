//! The applier's loop: batches of messages applied in log order, and the
//! triggers that end a batch (size, time, a fan-out, a queue gone quiet)
//! in a commit of the index and the publication of the next offset.

use super::triggers::{Idle, Triggers};
use super::*;

/// How many times a partition is sought again when its first message is
/// not the one sought, before that message is taken as what the log holds.
pub(super) const RESEEKS: u32 = 3;

impl Applier {
    pub(super) fn apply_until_stopped(&self, rx: Receiver<Feed>) -> Step<()> {
        // The group's offset, which commits never go below, read beside the
        // start (a first request to the group's coordinator takes about a
        // second): nothing is committed until it is known.
        let (shared, floor, partition) = (self.shared.clone(), self.floor.clone(), self.partition);
        std::thread::Builder::new()
            .name(format!("denorm-p{partition}-floor"))
            .spawn(move || floor.store(shared.probe.committed(partition).unwrap_or(-1), Ordering::SeqCst))
            .expect("spawn the floor read");
        let mut shard = self.open_shard()?;
        let mut checkpoint = self.took(shard.as_mut());
        // Started at the checkpoint by the assignment already, or sought now.
        let assigned = self.shared.assigned_at.lock().expect("assigned_at lock").remove(&self.partition);
        let mut positioned = if assigned == Some(target_of(checkpoint)) {
            // Read from the checkpoint already: the lanes' low mark starts
            // there, as after a seek. Without it, a first command deferred
            // into a lane left no low mark, and what other keys applied
            // beside it was not recorded until it finished (review of
            // verify, F12: a repair beside a held rename, right after the
            // worker started, was never seen applied).
            self.lanes.borrow_mut().tracker.reset_at(checkpoint);
            self.reading.set(position::Reading::started_at(target_of(checkpoint)));
            self.positioned(checkpoint)?
        } else {
            self.seek_to(checkpoint)
        };
        let mut first = true;
        // Seeks made again because a stale start overtook them (see below).
        let mut overtaken = 0u32;
        let mut generation_checked = Instant::now();
        // Messages handled since the last commit, kept until it succeeds: if
        // the index fails meanwhile, the shard is reopened (dropping whatever
        // state the failure left in the writer) and they are handled again.
        let mut batch: Vec<Record> = Vec::new();
        // Its size and time triggers (`triggers.rs`).
        let cfg = &self.shared.cfg;
        let mut triggers = Triggers::new(cfg.commit_linger, cfg.commit_quiet, cfg.max_batch, Instant::now());
        // How soon a batch beside a flooding tenant is committed.
        let tenant_commit = cfg.tenant_commit_on(self.shared.backend.commits_are_shared());
        // Feeds already received, in order, whose documents were prefetched
        // with those of the message before them (see `prefetch`).
        let mut ahead: VecDeque<Feed> = VecDeque::new();
        // Key lanes (`lanes.rs`): the head of `ahead` waits for a lane;
        // the messages handled since a fan-out's last page, and for how
        // long; whether the head of `ahead` was taken from the queue to see
        // if anything is ready.
        let (mut blocked, mut share, mut peeked) = (false, lanes::PageShare::default(), false);
        // The offset of the message last blocked at the head.
        let mut blocked_at: Option<i64> = None;
        while !self.stopping() {
            if let Some(e) = self.spill_failure() {
                // A spilled message could not be read back (`spill.rs`).
                self.fall_back_from(&mut shard, &mut batch, &format!("reading a spilled message back: {e}"))?;
            }
            if positioned && self.moving() && self.expire_move(shard.as_mut())? {
                // A move whose rest never came: read again from the
                // checkpoint, before it (`Applier::expire_move`).
                self.receiving.borrow_mut().take_rewind();
                self.commit(&mut shard, &mut batch)?;
                checkpoint = shard.checkpoint();
                (positioned, first) = (self.seek_to(checkpoint), true);
                triggers.reset();
            }
            if self.lanes.borrow_mut().take_fall_back() {
                // A lane failed: read again from the checkpoint.
                batch.clear();
                checkpoint = shard.checkpoint();
                (positioned, first) = (self.seek_to(checkpoint), true);
                triggers.reset();
            }
            // A flooding tenant's messages past the hold's bound (`spill.rs`)
            // are taken back into the hold as it has room.
            if positioned && self.spilling() {
                self.take_back();
            }
            // A page of a fan-out in a lane whenever nothing else is ready,
            // when the other messages had their share of the time
            // (`PageShare`), or when the head waits for a lane.
            // Not while the partition is being positioned: a fan-out that
            // completes hands its key's waiting messages back through
            // `ahead`, and what comes through it before the positioning is
            // dropped as read from the old position. (Lanes are dropped by
            // every seek.)
            let mut paged = false;
            if positioned && self.lane_jobs() > 0 {
                peeked |= self.peek(&rx, &mut ahead);
                if std::mem::take(&mut blocked) || ahead.is_empty() || share.due(Instant::now()) {
                    let started = Instant::now();
                    let ran = self.run_page(&mut shard, &mut batch, &mut ahead);
                    share.paged(started, matches!(ran, Ok(true)), Instant::now());
                    // A fan-out that completed without a commit of its own
                    // joined the batch: committed at the batch's deadline.
                    if !batch.is_empty() {
                        triggers.started(Instant::now());
                    }
                    match ran {
                        Err(Halt::Moved) => {
                            checkpoint = self.moved(&mut shard, &mut batch);
                            (positioned, first) = (false, true);
                            triggers.reset();
                        }
                        Err(Halt::Stopped) => break,
                        other => paged = other?,
                    }
                    if self.lanes.borrow().fell_back() {
                        // Nothing more before the partition is sought.
                        continue;
                    }
                    if !paged && !ahead.is_empty() {
                        // The head waits for fan-outs that cannot move now
                        // (a page pause): not a busy loop.
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
            // While fan-outs run in lanes, each commit also carries the
            // pages written since: committing at every pause of light
            // traffic keeps the other keys' latency low, at a price in the
            // fan-out's speed (docs/benchmark.md, "Key lanes").
            // A batch is committed once its queue stays empty for `quiet`
            // (a burst has been applied), or when it is `linger` old. Waits
            // are at most 100 ms, so that a stop is seen within that; none
            // while fan-outs run in lanes (1 ms while they cannot move).
            let wait = triggers.wait(Instant::now()).min(match self.lane_jobs() {
                0 => Duration::from_millis(100),
                _ if paged => Duration::ZERO,
                _ => Duration::from_millis(1),
            });
            // A flooding tenant's held messages (`hold.rs`): the next chunk
            // once nothing else is ready, or once the others had their
            // share.
            if positioned && self.held_len() > 0 && self.may_release() {
                peeked |= self.peek(&rx, &mut ahead);
                if ahead.is_empty() || self.release_due() {
                    self.release(&mut ahead, None);
                }
            }
            let (next, fresh) = match ahead.pop_front() {
                Some(feed) => (Ok(feed), std::mem::take(&mut peeked)),
                None => (self.receive(&rx, wait), true),
            };
            match next {
                Ok(Feed::Positioned(at)) => {
                    self.trace(-1, "positioned");
                    positioned = self.positioned_by(at, checkpoint)?
                }
                Ok(Feed::End(at)) => {
                    if positioned {
                        self.publication.borrow_mut().end_reported(at);
                        if batch.is_empty() {
                            self.publish_end();
                        }
                    }
                }
                Ok(Feed::Message(mut msg)) => {
                    self.trace(msg.offset(), "taken");
                    self.queued.take(queued_size(&msg));
                    if self.past_until(msg.offset()) {
                        continue; // a replay that stops there (`denorm verify`)
                    }
                    triggers.arrived(Instant::now());
                    if !positioned {
                        continue; // fetched from the group's offset, before the seek
                    }
                    // A message at or past the end reported makes it stale
                    // (`Publication::read`).
                    self.publication.borrow_mut().read(msg.offset());
                    // A first message other than the one sought: the seek
                    // came right after the assignment and the client's own
                    // start (from the group's offset) overtook it. Sought
                    // again a few times before the log is judged by it.
                    if first && msg.offset() != checkpoint.map_or(0, |c| c.offset as i64) && overtaken < RESEEKS {
                        overtaken += 1;
                        debug!(partition = self.partition, offset = msg.offset(), checkpoint = ?checkpoint.map(|c| c.offset), "first message is not the one sought: positioning again");
                        positioned = self.seek_to(checkpoint);
                        continue;
                    }
                    let in_lanes = self.lanes_on(msg.offset());
                    if !in_lanes {
                        self.trace(msg.offset(), "handled without lanes");
                    }
                    if in_lanes {
                        // Never the first message after positioning: it is
                        // judged against the checkpoint below.
                        match self.held(msg, !first, &mut ahead) {
                            Some(m) => msg = m,
                            None => continue,
                        }
                        if self.lanes_busy() {
                            let mut route = self.route(&msg);
                            if matches!(route, lanes::Route::NoLane) {
                                // A fan-out with no lane for it: its tenant
                                // is held rather than every tenant kept
                                // waiting (`hold.rs`). One over its
                                // tenant's share that is not held (another
                                // tenant is) takes a free lane all the same.
                                match self.held_for_lane(msg) {
                                    Some(m) => msg = m,
                                    None => continue,
                                }
                                if self.lane_free() {
                                    route = lanes::Route::Now;
                                }
                            }
                            match route {
                                lanes::Route::Now => {}
                                lanes::Route::AfterSpilled => {
                                    self.after_spilled(msg, &mut ahead);
                                    continue;
                                }
                                lanes::Route::AfterHeld => {
                                    self.trace(msg.offset(), "after the held");
                                    self.queued.add(queued_size(&msg));
                                    let offset = msg.offset();
                                    ahead.push_front(Feed::Message(msg));
                                    self.release(&mut ahead, Some(offset));
                                    continue;
                                }
                                lanes::Route::Behind(key) => {
                                    self.wait_in_lane(key, msg);
                                    share.handled();
                                    continue;
                                }
                                lanes::Route::Blocked | lanes::Route::NoLane => {
                                    self.trace(msg.offset(), "blocked");
                                    self.queued.add(queued_size(&msg));
                                    let first_block = blocked_at.replace(msg.offset()) != Some(msg.offset());
                                    ahead.push_front(Feed::Message(msg));
                                    blocked = true;
                                    // What was applied before it is
                                    // committed now: while it is blocked
                                    // the loop never waits, so the quiet
                                    // and linger commits never come (review
                                    // of lanes, F2).
                                    if first_block && !batch.is_empty() {
                                        match self.commit(&mut shard, &mut batch) {
                                            Err(Halt::Moved) => {
                                                checkpoint = self.moved(&mut shard, &mut batch);
                                                (positioned, first) = (false, true);
                                                triggers.reset();
                                            }
                                            other => {
                                                other?;
                                                triggers.reset();
                                            }
                                        }
                                    }
                                    continue;
                                }
                            }
                        }
                        share.handled();
                        self.lanes.borrow_mut().allow_deferring(true);
                    }
                    if fresh && shard.prefetches() {
                        self.prefetch(shard.as_mut(), &msg, &rx, &mut ahead);
                    }
                    if std::mem::take(&mut first) {
                        overtaken = 0;
                        let fingerprint = crate::logid::fingerprint(msg.key(), msg.payload());
                        self.judge(checkpoint, crate::logid::first_after(checkpoint, msg.offset(), fingerprint, self.low.get()))?;
                    }
                    self.lag_seconds.set(age_seconds(&msg));
                    let oldest = self.oldest_job_ms();
                    self.busy_since_ms.store(if oldest > 0 { oldest } else { crate::clock::now_millis().max(1) }, Ordering::SeqCst);
                    if self.beside_a_flood(&msg) {
                        #[cfg(test)]
                        self.shared.stats.hurried.fetch_add(1, Ordering::SeqCst);
                        triggers.hurry(Instant::now(), tenant_commit);
                    }
                    batch.push(msg);
                    let fan_out = match self.handle_last(&mut shard, &mut batch) {
                        Err(Halt::Stopped) => break,
                        other => other,
                    };
                    self.lanes.borrow_mut().allow_deferring(false);
                    if self.lanes.borrow().fell_back() {
                        // A lane failed: nothing more before the partition
                        // is sought again (top of the loop).
                        self.busy_since_ms.store(0, Ordering::SeqCst);
                        continue;
                    }
                    let due = triggers.joined(batch.len(), Instant::now());
                    // Fan-outs are committed on their own so that their
                    // effects are visible and bounded; so are the chunks of
                    // a move in flight once they take `--queue-kb`.
                    let step = fan_out.and_then(|fan_out| {
                        match fan_out || due || self.awaited(&batch) || shard.wants_commit() || self.moving() && batch.iter().map(queued_size).sum::<usize>() >= self.shared.cfg.queue_bytes {
                            true => self.commit(&mut shard, &mut batch).map(|()| triggers.reset()),
                            false => Ok(()),
                        }
                    });
                    if let Err(Halt::Moved) = step {
                        checkpoint = self.moved(&mut shard, &mut batch);
                        (positioned, first) = (false, true);
                        triggers.reset();
                    } else {
                        step?;
                    }
                    if self.receiving.borrow_mut().take_rewind() {
                        // A move that passed messages over ended (and was
                        // committed): they are read again from the
                        // checkpoint, which is before the move.
                        self.commit(&mut shard, &mut batch)?;
                        checkpoint = shard.checkpoint();
                        (positioned, first) = (self.seek_to(checkpoint), true);
                        triggers.reset();
                    }
                    self.busy_since_ms.store(self.oldest_job_ms(), Ordering::SeqCst);
                }
                Err(RecvTimeoutError::Timeout) if triggers.timed_out(Instant::now()) == Idle::NoBatch => {
                    // Idle with everything committed: nothing is waiting
                    // but, maybe, the last commit to become searchable.
                    self.lag_seconds.set(0.0);
                    self.publish_pending(shard.as_mut(), false);
                    self.publish_end();
                }
                Err(RecvTimeoutError::Timeout) if triggers.timed_out(Instant::now()) == Idle::Early => {
                    // Neither quiet for long enough nor old enough: the wait
                    // was cut short to look at the stop flag.
                }
                Err(RecvTimeoutError::Timeout) => {
                    triggers.reset();
                    match self.commit(&mut shard, &mut batch) {
                        Err(Halt::Moved) => {
                            checkpoint = self.moved(&mut shard, &mut batch);
                            (positioned, first) = (false, true);
                        }
                        other => other?,
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
            // Between batches (nothing uncommitted), or between the pages of
            // fan-outs in lanes, at most every 100 ms: a rebuild may have
            // switched the index to a new generation. While lanes are busy
            // the worker follows at once, dropping the lanes and what it
            // applied to the old generation (the new one's checkpoint says
            // where to resume): it wrote, until every lane drained, a
            // generation searches no longer read (review of lanes, F5).
            let lanes_busy = self.lanes_busy();
            if (batch.is_empty() || lanes_busy) && generation_checked.elapsed() >= GENERATION_CHECK {
                generation_checked = Instant::now();
                if self.follow_generation(&mut shard)? {
                    checkpoint = match lanes_busy || !batch.is_empty() {
                        true => self.moved(&mut shard, &mut batch),
                        false => {
                            let c = self.took(shard.as_mut());
                            self.seek_to(c);
                            c
                        }
                    };
                    (positioned, first) = (false, true);
                    triggers.reset();
                }
            }
        }
        // Stopping: make what is applied durable, so the next owner resumes
        // after it, and searchable, so that its offset is published. Fan-outs
        // unfinished in lanes are not drained: the offset recorded stays
        // below the lowest unfinished command, which the next owner applies
        // again (docs/architecture.md, "Key lanes").
        if let Some(lowest) = self.lanes.borrow().tracker.lowest_open() {
            info!(
                partition = self.partition,
                fan_outs = self.lane_jobs(),
                lowest_unfinished = lowest,
                "stopping between the pages of fan-outs in key lanes: the next owner applies again from the lowest unfinished command"
            );
        }
        let result = self.commit(&mut shard, &mut batch);
        self.publish_pending(shard.as_mut(), true);
        // The lanes are left to the next owner, which reports them (review
        // of lanes, F14: two workers exported the partition's busy lanes).
        gauge!(m::PARTITION_BUSY_LANES, "partition" => self.partition.to_string()).set(0.0);
        result
    }

    /// The next feed within `wait`, passing over what
    /// [`Applier::received`] drops.
    fn receive(&self, rx: &Receiver<Feed>, wait: Duration) -> Result<Feed, RecvTimeoutError> {
        let until = Instant::now() + wait;
        loop {
            if let Some(feed) = self.received(rx.recv_timeout(until.saturating_duration_since(Instant::now()))?) {
                return Ok(feed);
            }
        }
    }

    /// Receives what is already waiting behind `msg` (up to
    /// [`PREFETCH_WINDOW`] feeds, without waiting) into `ahead`, and lets the
    /// shard fetch the documents all of them read at once: on
    /// Elasticsearch one `_mget` instead of a GET per command. Messages stay
    /// counted as queued until they are handled.
    pub(super) fn prefetch(&self, shard: &mut dyn Shard, msg: &Record, rx: &Receiver<Feed>, ahead: &mut VecDeque<Feed>) {
        while ahead.len() < PREFETCH_WINDOW {
            match rx.try_recv().map(|f| self.received(f)) {
                Ok(None) => {}
                Ok(Some(feed @ Feed::Message(_))) => ahead.push_back(feed),
                Ok(Some(feed)) => {
                    ahead.push_back(feed);
                    break;
                }
                Err(_) => break,
            }
        }
        if ahead.is_empty() {
            return;
        }
        let messages = std::iter::once(msg).chain(ahead.iter().filter_map(|f| match f {
            Feed::Message(m) => Some(m),
            _ => None,
        }));
        let (mut reads, mut scans) = (Vec::new(), Vec::new());
        for m in messages {
            if let Ok(Admitted::Command(e)) = admit(&self.shared.codec, m.key(), m.payload(), self.shared.cfg.max_message_bytes) {
                reads.extend(crate::apply::reads(&e.command));
                scans.extend(crate::apply::dependents_scans(&e.command));
            }
        }
        if let Err(e) = shard.prefetch(&reads) {
            debug!(partition = self.partition, error = %e, "prefetching failed; each command reads its documents on its own");
        }
        if !scans.is_empty() {
            if let Err(e) = shard.prefetch_scans(&scans) {
                debug!(partition = self.partition, error = %e, "reading the fan-outs' dependents ahead failed; each fan-out searches on its own");
            }
        }
    }

    /// After a transient failure of the last message of `batch`: waits, and
    /// applies the rest of the batch again on a fresh writer.
    fn recover(&self, retry: &mut Retrying<'_>, shard: &mut ShardBox, batch: &mut Vec<Record>, e: &dyn std::fmt::Display) -> Step<()> {
        let n = batch.len() - 1;
        let recovered = retry.failed(e).and_then(|()| self.reopen(shard, &batch[..n]));
        if recovered.is_err() {
            // The writer may hold half of this command: nothing of the
            // batch is committed on the way out, the next owner redoes it.
            batch.clear();
        }
        recovered
    }

    /// Handles the last message of `batch`, recovering from transient
    /// failures for as long as they last. Whether it was a fan-out.
    pub(super) fn handle_last(&self, shard: &mut ShardBox, batch: &mut Vec<Record>) -> Step<bool> {
        let mut retry = self.retrying(Op::Apply);
        loop {
            let msg = batch.last().expect("batch holds the message");
            match self.handle(shard.as_mut(), msg) {
                Ok(Handled::Done { fan_out }) => return Ok(fan_out),
                Ok(Handled::Duplicate | Handled::PassedOver) => {
                    batch.pop();
                    return Ok(false);
                }
                Ok(Handled::Deferred(job)) => {
                    batch.pop();
                    self.start_lane(job);
                    return Ok(false);
                }
                Err(Halt::CommitFirst(e)) if self.must_fall_back(batch) => return self.fall_back_from(shard, batch, &e).map(|()| false),
                Err(Halt::Retry(e)) if self.must_fall_back(batch) => return self.fall_back_from(shard, batch, &e).map(|()| false),
                Err(Halt::CommitFirst(e)) => {
                    warn!(partition = self.partition, error = %e, commands = batch.len() - 1, "the index refused a write of the batch before a cross-key step: committing its messages one by one to find it");
                    self.isolate(shard, batch)?;
                    return Ok(false);
                }
                Err(Halt::Retry(Transient::Placement(_))) => {
                    // Expected, not a failure: reopened (after the
                    // backoff's wait, should the placement read be older
                    // still), the message is handled again.
                    retry.pause()?;
                    let n = batch.len() - 1;
                    self.reopen(shard, &batch[..n])?;
                }
                Err(Halt::Retry(e)) => self.recover(&mut retry, shard, batch, &e)?,
                Err(halt) => {
                    // Stopped within the command (its permanent-failure
                    // retries, or its dead letter): the earlier messages of
                    // the batch are still committed on the way out.
                    batch.pop();
                    return Err(halt);
                }
            }
        }
    }

    /// Commits the shard and publishes the offset after its checkpoint,
    /// retrying (with a fresh writer) while the index fails. Nothing of
    /// `batch` is published when stopped meanwhile. While a cross-key move
    /// is in flight, the commit makes its documents durable; the checkpoint
    /// stays before it.
    /// With nothing ahead, takes the next feed from the queue if one is
    /// there without waiting, to see what is ready: whether it took one.
    fn peek(&self, rx: &Receiver<Feed>, ahead: &mut VecDeque<Feed>) -> bool {
        if !ahead.is_empty() {
            return false;
        }
        match rx.try_recv().ok().and_then(|f| self.received(f)) {
            Some(feed) => {
                ahead.push_back(feed);
                true
            }
            None => false,
        }
    }

    pub(super) fn commit(&self, shard: &mut ShardBox, batch: &mut Vec<Record>) -> Step<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut retry = self.retrying(Op::Commit);
        loop {
            let t = Instant::now();
            self.record_done_now(shard.as_mut());
            match shard.commit() {
                Ok(()) => {
                    histogram!(m::INDEX_COMMIT_SECONDS).record(t.elapsed().as_secs_f64());
                    self.committed();
                    self.publish_checkpoint(shard.as_mut());
                    batch.clear();
                    self.publish_end();
                    self.parked_gauge(shard.as_mut());
                    return Ok(());
                }
                Err(e) if self.must_fall_back(batch) => return self.fall_back_from(shard, batch, &e),
                Err(e) if e.is_retryable() => {
                    retry.failed(&format_args!("{e}; reopening the shard"))?;
                    self.reopen(shard, batch)?;
                }
                Err(error) => {
                    warn!(partition = self.partition, %error, commands = batch.len(), "the index refused a write of this batch: committing its commands one by one to find it");
                    return self.isolate(shard, batch);
                }
            }
        }
    }

    /// Publishes the offset after the shard's checkpoint (what its last
    /// commit recorded) once the shard says the commit is searchable, else
    /// keeps it for [`Self::publish_pending`].
    pub(super) fn publish_checkpoint(&self, shard: &mut dyn Shard) {
        if let Some(c) = shard.checkpoint() {
            self.publication.borrow_mut().committed(Some(c));
            self.publish_pending(shard, false);
        }
    }

    /// With everything fed published (the caller has no batch open) and no
    /// move in flight, publishes the end of the partition the consumer
    /// reported (past offsets without messages, such as transaction
    /// markers: offset end-1 may never be a message, and `produce --wait`
    /// and a rebuild's cutover wait for the end).
    pub(super) fn publish_end(&self) {
        let idle = !self.moving() && !self.receiving.borrow().rewind_due() && !self.lanes_busy();
        self.publication.borrow().publish_end(idle);
    }

    /// Publishes the offset kept by [`Self::publish`] if its commit has
    /// become searchable (asked again at every commit and every idle
    /// moment; a failed check is asked again then).
    pub(super) fn publish_pending(&self, shard: &mut dyn Shard, force: bool) {
        if !self.publication.borrow().waiting() {
            return;
        }
        match shard.searchable(force) {
            Ok(true) => self.publication.borrow_mut().searchable(shard.progress().committed_done()),
            Ok(false) => {}
            Err(error) => warn!(partition = self.partition, %error, "making the last commit searchable failed; tried again"),
        }
    }
}
