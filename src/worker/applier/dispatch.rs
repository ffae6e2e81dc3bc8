//! One message, dispatched: a command (through [`crate::apply`]), a
//! control message, a move's chunk, or a rejection.

use super::*;
use crate::apply::RepairGuard;
use crate::command::tenant::Shown;

impl Applier {
    /// Handles one message. `Halt::Retry` is a transient failure (the
    /// caller reopens the shard and tries again); permanent failures end in
    /// the dead-letter topic.
    pub(super) fn handle(&self, shard: &mut dyn Shard, msg: &Record) -> Step<Handled> {
        let offset = msg.offset();
        if shard.applied().is_some_and(|a| offset as u64 <= a) {
            count("unknown", outcome::DUPLICATE);
            return Ok(Handled::Duplicate);
        }
        // Applied above the checkpoint before (key lanes finish commands
        // out of order, and a previous owner's last commit recorded which):
        // not applied again (issue 45).
        if shard.progress().done_above(offset) {
            count("unknown", outcome::DUPLICATE);
            debug!(partition = self.partition, offset, "applied above the checkpoint by the last commit: skipped");
            self.mark(shard, msg);
            return Ok(Handled::Done { fan_out: false });
        }
        let origin = Origin { key: msg.key(), payload: msg.payload(), offset, at: offset };
        let admitted = match self.admitted(msg) {
            Err(NotAdmitted::Unavailable(e)) => return Err(Halt::Retry(Transient::Registry(e))),
            Err(NotAdmitted::Rejected(r)) => Err(r),
            Ok(a) => self.placed(msg, a),
        };
        let chunk_of = match &admitted {
            Ok(Admitted::Move(m)) => Some(m.source()),
            Err(r) => r.chunk.as_ref().map(|m| m.source()),
            _ => None,
        };
        // A chunk of an attempt its source gave up, read again, is ignored;
        // the other messages wait while a move is in flight.
        let admit = self.receiving.borrow_mut().admit(chunk_of, offset);
        match admit {
            receiving::Admit::Handle => {}
            receiving::Admit::Void => {
                self.mark(shard, msg);
                return Ok(Handled::Done { fan_out: false });
            }
            receiving::Admit::PassOver => return Ok(Handled::PassedOver),
            receiving::Admit::Expired => {
                let detail = format!("a chunk of a cross-key move whose next chunk did not come within --wait-limit-secs ({} s): the move was ended here, its documents withdrawn; reprocessing writes this chunk's files as of then", self.shared.cfg.wait_limit.as_secs());
                let handled = self.abort(shard, &origin, dlq::reason::MOVE_INCOMPLETE, detail, 1, None)?;
                self.mark(shard, msg);
                return Ok(handled);
            }
        }
        // A replay of some keys only: the others' messages pass, applied
        // without effect.
        if let Some(sample) = self.shared.cfg.mode.keys() {
            if !msg.key().and_then(|k| std::str::from_utf8(k).ok()).is_some_and(|k| sample.admits(k)) {
                self.mark(shard, msg);
                return Ok(Handled::Done { fan_out: false });
            }
        }
        let handled = match admitted {
            Err(mut r) => {
                let chunk = r.chunk.take();
                if chunk.as_ref().is_some_and(|mv| crate::moves::arrival(shard.received(), None, mv) == crate::moves::Arrival::Duplicate) {
                    // A resend of a chunk of a move complete here (read
                    // again after the move): dead-lettered the first time.
                    self.mark(shard, msg);
                    return Ok(Handled::Done { fan_out: false });
                }
                // A key no valid message has is neither parked nor kept
                // in the letter: its length is hostile input.
                let keyless;
                let origin = match r.reason == reason::OVERSIZED_KEY {
                    true => {
                        keyless = Origin { key: None, ..origin };
                        &keyless
                    }
                    false => &origin,
                };
                let handled = self.reject(shard, origin, r)?;
                if let Some(mv) = chunk {
                    // Dead-lettered with its files; its part in the move is
                    // played without them, so that the move ends.
                    return self.move_in(shard, msg, &crate::command::moves::MoveIn { files: Vec::new(), ..*mv });
                }
                handled
            }
            Ok(Admitted::Control(c)) => {
                self.lanes.borrow_mut().allow_deferring(false);
                self.control(shard, msg, c)?
            }
            Ok(Admitted::Move(mv)) => return self.move_in(shard, msg, &mv),
            Ok(Admitted::Command(e)) => {
                origin.handled_again(shard);
                match origin.parked_behind(shard) {
                    Some(behind) => self.park(shard, &origin, Some(e.command_id.clone()), behind, e.command.kind())?,
                    None => {
                        if let Some(previous) = e.command.previous_key() {
                            let id = match &e.command {
                                Command::UpsertFile { id, .. } | Command::UpsertPost { id, .. } => id.as_str(),
                                _ => "",
                            };
                            let what = format!("the owner change of {id:?} ({}) from {previous:?}", e.command.kind());
                            match e.after {
                                Some(at) => {
                                    if let moves::Awaited::TimedOut(detail) = self.await_departure(shard, at, offset, &what, true)? {
                                        let handled = self.abort(shard, &origin, dlq::reason::TAKEOVER_TIMEOUT, detail, 1, Some(e.command_id.clone()))?;
                                        self.mark(shard, msg);
                                        return Ok(handled);
                                    }
                                }
                                None => warn_without_after(self.partition, offset, &what),
                            }
                        }
                        self.command(shard, &e, offset, &origin)?
                    }
                }
            }
        };
        if let Handled::Done { .. } = handled {
            self.mark(shard, msg);
        }
        Ok(handled)
    }

    /// `msg` decoded and validated ([`admit`]); with signing keys, a
    /// move's chunk or a control message must carry a valid signature,
    /// or it is refused as forged, parking nothing (the key it names is
    /// another writer's).
    pub(super) fn admitted(&self, msg: &Record) -> Result<Admitted, NotAdmitted> {
        let a = admit(&self.shared.codec, msg.key(), msg.payload(), self.shared.cfg.max_message_bytes)?;
        let (Some(keys), Admitted::Control(_) | Admitted::Move(_)) = (&self.shared.cfg.kafka.signing, &a) else { return Ok(a) };
        let kafka = &self.shared.cfg.kafka;
        let why = match keys.check(&kafka.topic, msg.key(), msg.payload().unwrap_or_default(), msg.signature.as_deref()) {
            crate::signing::Provenance::Signed => return Ok(a),
            crate::signing::Provenance::Unsigned => "no",
            crate::signing::Provenance::BadSignature => "an invalid",
        };
        let what = match a {
            Admitted::Move(_) => "a cross-key move's chunk",
            _ => "a control message",
        };
        let detail = format!(
            "{what} with {why} {} header, while the workers check signatures (--signing-key-file): not written by a worker or an operator of this topic; not carried out",
            crate::signing::HEADER
        );
        Err(NotAdmitted::Rejected(Rejection { reason: dlq::reason::FORGED, detail, chunk: None, parks: false }))
    }

    /// Checks where a command or a move's chunk is: its key must hash
    /// (murmur2) to this partition, or its order with the key's other
    /// messages is not guaranteed and a move would not reach them. With
    /// `--any-partitioner`, any partition is accepted and renames across
    /// top-level directories are refused.
    fn placed(&self, msg: &Record, a: Admitted) -> Result<Admitted, Rejection> {
        let n = self.shared.log_partitions;
        if self.shared.cfg.any_partitioner {
            return match &a {
                Admitted::Command(e) if matches!(e.command, Command::RenamePath { .. }) && e.command.destination_key().is_some() => Err(Rejection {
                    reason: reason::INVALID_COMMAND,
                    detail: "a rename across top-level directories needs the topic's keys placed by murmur2 (the Java client's partitioner): refused with --any-partitioner".into(),
                    chunk: None,
                    parks: true,
                }),
                _ => Ok(a),
            };
        }
        let (Admitted::Command(_) | Admitted::Move(_)) = &a else { return Ok(a) };
        let Some(key) = msg.key().filter(|k| !k.is_empty()) else { return Ok(a) };
        let home = crate::command::partitioner::partition_of_bytes(key, n);
        if home == self.partition {
            return Ok(a);
        }
        let detail = format!(
            "key {:?} belongs to partition {home} of {n} (murmur2, the Java client's partitioner, which denorm's producer uses), not {}: its producer places keys another way (docs/producers.md names each client's setting; --any-partitioner accepts such a topic)",
            String::from_utf8_lossy(key),
            self.partition
        );
        let chunk = match a {
            Admitted::Move(m) => Some(Box::new(m)),
            _ => None,
        };
        Err(Rejection { reason: crate::dlq::reason::WRONG_PARTITION, detail, chunk, parks: true })
    }

    /// Marks `msg` applied, unless a cross-key move is in flight (nothing
    /// from its first chunk on is, until it ends).
    pub(super) fn mark(&self, shard: &mut dyn Shard, msg: &Record) {
        // With lanes, the lowest unfinished command's predecessor, and
        // what is finished above it.
        let low = self.lanes.borrow_mut().tracker.finish(checkpoint_of(msg));
        if let (false, Some(low)) = (self.moving(), low) {
            let due = self.lanes.borrow_mut().tracker.done_above_due();
            match due {
                true => self.record_done(shard, low),
                false => shard.progress_mut().mark_low(low),
            }
        }
    }

    /// Records what is applied: up to `low`, and above it.
    fn record_done(&self, shard: &mut dyn Shard, low: Checkpoint) {
        let above = self.lanes.borrow().tracker.done_above(shard.progress().committed_done());
        shard.progress_mut().mark_applied(low, above);
    }

    /// Brings the record of what is applied above the low mark up to date
    /// before a commit ([`tracker::Tracker::done_above_due`]).
    pub(super) fn record_done_now(&self, shard: &mut dyn Shard) {
        let low = self.lanes.borrow().tracker.low();
        if let (false, Some(low)) = (self.moving(), low) {
            self.record_done(shard, low);
        }
    }

    /// A message that cannot be admitted: aborted at once (decoding and
    /// validation are deterministic: retrying changes nothing).
    pub(super) fn reject(&self, shard: &mut dyn Shard, origin: &Origin<'_>, r: Rejection) -> Step<Handled> {
        counter!(m::MESSAGES_REJECTED_TOTAL, "reason" => r.reason).increment(1);
        count("unknown", if r.reason == reason::INVALID_COMMAND { outcome::INVALID } else { outcome::UNDECODABLE });
        self.abort_parking(shard, origin, r.reason, r.detail, 1, None, r.parks)
    }

    /// Applies a command, retrying a permanent index failure up to
    /// `max_attempts` times before aborting it.
    pub(super) fn command(&self, shard: &mut dyn Shard, e: &Envelope, pos: i64, origin: &Origin<'_>) -> Step<Handled> {
        let (partition, cmd) = (self.partition, &e.command);
        if let Some(r) = e.repair {
            let guard = match crate::apply::repair_guard(shard, cmd, r, pos as u64) {
                Ok(guard) => guard,
                Err(e) if e.is_retryable() => return Err(Halt::Retry(Transient::Index(e))),
                Err(error) => RepairGuard::Refuse(format!("reading its document: {error}")),
            };
            let outcome = match guard {
                RepairGuard::Apply => outcome::APPLIED,
                RepairGuard::Superseded => "superseded",
                RepairGuard::Refuse(_) => "refused",
            };
            // Counted live only: a replay applies the repairs the live
            // workers counted (review of verify, F18).
            if !self.shared.cfg.mode.is_replay() {
                counter!(m::REPAIRS_TOTAL, "outcome" => outcome).increment(1);
            }
            if let RepairGuard::Refuse(detail) = guard {
                // Dead-lettered with its reason; its key goes on.
                warn!(partition, offset = pos, key = ?Shown(cmd.key()), %detail, "repair refused");
                self.dead_letter(origin, dlq::reason::REPAIR_REFUSED, detail, 1, Some(e.command_id.clone()), None)?;
                return Ok(Handled::Done { fan_out: false });
            }
        }
        if crate::faults::lists("apply.hold", cmd.key()) {
            crate::faults::reached("apply.hold");
            while crate::faults::lists("apply.hold", cmd.key()) && !self.stopping() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // A fan-out's scan read whole when it began.
        let mut ready = None;
        if cmd.is_fan_out() {
            match cmd {
                // A profile change's fan-out is small and frequent.
                Command::UpsertUser { .. } => debug!(partition, offset = pos, command = cmd.kind(), key = ?Shown(cmd.key()), "fan-out started"),
                _ => info!(partition, offset = pos, command = cmd.kind(), key = ?Shown(cmd.key()), "fan-out started"),
            }
            // A fan-out's scan must see the batch's earlier writes: the
            // embedded index lays its pending writes over the committed
            // snapshot; otherwise they are committed here first
            // (Elasticsearch sends them), so that a refusal of one of them
            // is traced to its own command (`Halt::CommitFirst`) instead
            // of aborting this one.
            if !crate::apply::fan_out_scan(cmd).is_some_and(|scan| shard.fan_out_reads_pending(&scan, self.shared.cfg.fan_out.page_size)) {
                self.commit_before(shard)?;
            }
            match self.lane_for(shard, cmd)? {
                // Read whole as it began (a profile change's few posts):
                // run now, below, without a lane.
                Some(pages) if pages.is_one_page() => ready = Some(pages),
                Some(pages) => return Ok(Handled::Deferred(Box::new(lanes::Job::new(origin, e, pages)))),
                None => {}
            }
        }
        let mut retry = self.retrying(Op::Rejected);
        let mut attempts = 0;
        // Chunks of a cross-key rename's move written by its last attempt.
        let mut sent = 0;
        loop {
            attempts += 1;
            let t = Instant::now();
            let result = if crate::faults::lists("index.reject", cmd.key()) {
                crate::faults::reached("index.reject");
                Err(IndexError::Rejected("injected fault index.reject".into()))
            } else if let (Command::RenamePath { from, to }, Some(_)) = (cmd, cmd.destination_key()) {
                match self.move_out(shard, e, from, to, pos)? {
                    moves::MoveOut::Moved(n) => Ok(n),
                    moves::MoveOut::Failed { error, sent: n } => {
                        sent = n;
                        Err(error)
                    }
                    moves::MoveOut::Invalid { detail, sent } => {
                        count(cmd.kind(), outcome::INVALID);
                        self.end_attempt(e, from, to, pos, sent)?;
                        return self.abort(shard, origin, reason::INVALID_COMMAND, detail, attempts, Some(e.command_id.clone()));
                    }
                }
            } else if let Some(mut pages) = ready.take() {
                crate::apply::fan_out_rest(shard, cmd, pos as u64, &mut pages)
            } else {
                apply(shard, cmd, pos as u64, self.shared.cfg.fan_out)
            };
            match result {
                Ok(docs) => {
                    let elapsed = t.elapsed();
                    histogram!(m::COMMAND_DOCUMENTS, "type" => cmd.kind()).record(docs as f64);
                    histogram!(m::COMMAND_SECONDS, "type" => cmd.kind()).record(elapsed.as_secs_f64());
                    count(cmd.kind(), outcome::APPLIED);
                    m::tenants::applied(cmd.tenant(), cmd.is_fan_out().then_some(docs), e.issued_at);
                    self.shared.stats.record(docs, cmd.is_fan_out(), elapsed);
                    self.trace(pos, APPLIED);
                    let alone = cmd.is_fan_out() && self.commits_alone(docs);
                    if alone {
                        info!(partition, offset = pos, command = cmd.kind(), documents = docs, ms = elapsed.as_millis() as u64, "fan-out applied");
                    } else if cmd.is_fan_out() {
                        debug!(partition, offset = pos, command = cmd.kind(), documents = docs, ms = elapsed.as_millis() as u64, "fan-out applied");
                    }
                    return Ok(Handled::Done { fan_out: alone });
                }
                Err(e) if e.is_retryable() => return Err(Halt::Retry(Transient::Index(e))),
                Err(error) if attempts < self.shared.cfg.max_attempts.max(1) => {
                    retry.failed(&format_args!("{error} (offset {pos}, attempt {attempts})"))?;
                }
                Err(error) => {
                    count(cmd.kind(), outcome::FAILED);
                    if let Command::RenamePath { from, to } = cmd {
                        self.end_attempt(e, from, to, pos, sent)?;
                    }
                    return self.abort(shard, origin, dlq::reason::INDEX_REJECTED, error.to_string(), attempts, Some(e.command_id.clone()));
                }
            }
        }
    }

    /// The pages of a fan-out begun for its key's lane, when a lane is free
    /// (see `lanes.rs`); pages read whole as they began are run at once by
    /// the caller instead. Otherwise (`None`) it runs here, whole. A
    /// backend that cannot start it now is retried like any write.
    fn lane_for(&self, shard: &mut dyn Shard, cmd: &Command) -> Step<Option<crate::index::Pages>> {
        let free = self.lanes.borrow().may_defer() && self.lane_jobs() < self.shared.cfg.lanes;
        if !free || cmd.destination_key().is_some() || crate::faults::lists("index.reject", cmd.key()) {
            return Ok(None);
        }
        let Some(scan) = crate::apply::fan_out_scan(cmd) else { return Ok(None) };
        match shard.rewrite_begin(&scan, self.shared.cfg.fan_out.page_size) {
            Ok(pages) => Ok(Some(pages)),
            Err(e) if e.is_retryable() => Err(Halt::Retry(Transient::Index(e))),
            Err(error) => {
                debug!(partition = self.partition, %error, "a fan-out could not start in a lane: run whole");
                Ok(None)
            }
        }
    }

    /// Carries out an operator's control message (see [`crate::dlq`]).
    pub(super) fn control(&self, shard: &mut dyn Shard, msg: &Record, c: Control) -> Step<Handled> {
        count("control", outcome::CONTROL);
        match c.action {
            Action::Replay => {
                let origin = Origin { key: msg.key(), payload: Some(&c.payload), offset: c.origin_offset, at: msg.offset() };
                if let Some(p) = shard.parking().get(&c.key).cloned() {
                    if !p.covered_by(c.through, c.through_at) {
                        // Something of this key was dead-lettered after the
                        // operator looked: replaying now would overtake it.
                        return self.park(shard, &origin, None, p.behind, "control");
                    }
                    if c.dlq_offset <= p.replayed_through {
                        return Ok(Handled::Done { fan_out: false });
                    }
                }
                let handled = match admit(&self.shared.codec, msg.key(), Some(&c.payload), self.shared.cfg.max_message_bytes) {
                    Err(NotAdmitted::Unavailable(e)) => return Err(Halt::Retry(Transient::Registry(e))),
                    Err(NotAdmitted::Rejected(r)) => self.reject(shard, &origin, r)?,
                    Ok(Admitted::Control(_)) => {
                        let r = Rejection { reason: reason::INVALID_COMMAND, detail: "a control message cannot be replayed".into(), chunk: None, parks: true };
                        self.reject(shard, &origin, r)?
                    }
                    Ok(Admitted::Command(e)) => self.command(shard, &e, msg.offset(), &origin)?,
                    // A move's chunk that was dead-lettered (the index
                    // refused one of its documents): its files are written
                    // as of now, like upserts.
                    Ok(Admitted::Move(mv)) => {
                        crate::moves::move_in(shard, &mv, msg.offset() as u64)?;
                        Handled::Done { fan_out: false }
                    }
                };
                if let (Handled::Done { .. }, Some(p)) = (&handled, shard.parking().get_mut(&c.key)) {
                    p.replayed_through = p.replayed_through.max(c.dlq_offset);
                }
                Ok(handled)
            }
            Action::Place => {
                // A tenant moved between placements: a live writer opened
                // before the move is reopened, reading the placement
                // afresh (and saying so in the index). A replay writes as
                // its rebuild placed it.
                let live = matches!(self.shared.cfg.mode, crate::worker::Mode::Live);
                if live {
                    crate::faults::hold("apply.place");
                }
                if live && !shard.placement_taken(c.origin_offset.max(0) as u64, c.through.max(0) as u64) {
                    if self.place_reread.replace(None) == Some(msg.offset()) {
                        // Reopened, the placement read afresh, and still
                        // not taken: the move it names was never recorded
                        // (the mover records it before it writes this).
                        let origin = Origin { key: msg.key(), payload: msg.payload(), offset: msg.offset(), at: msg.offset() };
                        let detail = format!("PLACE names move {} of generation {}, which the index's placement does not record (read afresh): not carried out", c.through, c.origin_offset);
                        return self.reject(shard, &origin, Rejection { reason: dlq::reason::INVALID_CONTROL, detail, chunk: None, parks: false });
                    }
                    self.place_reread.set(Some(msg.offset()));
                    info!(partition = self.partition, generation = c.origin_offset, moves = c.through, "a tenant moved between placements: reopening the shard to read the placement");
                    return Err(Halt::Retry(Transient::Placement(format!("a tenant moved between placements (move {} of generation {})", c.through, c.origin_offset))));
                }
                Ok(Handled::Done { fan_out: false })
            }
            Action::Resolve | Action::Discard => {
                let kind = c.action.marker();
                // A rebuild replays the operator's request: the live run
                // wrote its marker already.
                if !self.shared.cfg.mode.marker_written(&(c.key.clone(), c.dlq_partition, kind, c.through)) {
                    self.retry_dead_letter(|| self.shared.outbox.marker(c.dlq_partition, &c.key, kind, c.through, c.through_at, self.partition))?;
                }
                let covered = shard.parking().get(&c.key).map(|p| p.covered_by(c.through, c.through_at));
                match covered {
                    Some(true) => {
                        shard.parking().remove(&c.key);
                        info!(partition = self.partition, key = %Shown(&c.key), marker = kind.as_str(), "key resumed");
                    }
                    Some(false) => warn!(
                        partition = self.partition,
                        key = %Shown(&c.key),
                        "key stays parked: more of its commands were dead-lettered after the operator's request; run `denorm dlq reprocess` again"
                    ),
                    None => {}
                }
                Ok(Handled::Done { fan_out: false })
            }
        }
    }
}
