//! Both sides of a cross-key move (docs/cross-key.md): the source writes
//! the chunks and deletes; the destination applies them and holds its other
//! messages until the last chunk; take-overs wait for their departure.

use super::*;
use crate::retry::Polled;

/// How a take-over's wait for the partition its documents leave ended.
#[derive(Debug)]
pub(super) enum Awaited {
    /// The departure is applied there (or needs no wait).
    Departed,
    /// Not within `--wait-limit-secs`: why, for the dead letter.
    TimedOut(String),
}

/// How the source side of a cross-key rename ended.
pub(super) enum MoveOut {
    /// The files were handed over and deleted here: how many.
    Moved(u64),
    /// The index failed after `sent` chunks were written (the rename is
    /// tried again, which writes the move again from its first chunk, or
    /// given up: then [`Applier::end_attempt`]).
    Failed { error: IndexError, sent: usize },
    /// A renamed path would not be valid: the rename is refused (after
    /// `sent` chunks were written).
    Invalid { detail: String, sent: usize },
}

impl Applier {
    /// Forgets the move in flight (the shard moved to another generation:
    /// the partition is read again from its checkpoint there).
    pub(super) fn reset_incoming(&self) {
        self.receiving.borrow_mut().reset();
    }

    /// The shard committed: a writer reopened from here goes on from the
    /// move state as it is now.
    pub(super) fn committed(&self) {
        self.receiving.borrow_mut().committed();
    }

    /// The shard was reopened at its last commit: so is the move state.
    pub(super) fn back_at_commit(&self) {
        self.receiving.borrow_mut().back_at_commit();
    }

    /// Whether a cross-key move spanning several messages is in flight.
    pub(super) fn moving(&self) -> bool {
        self.receiving.borrow().moving()
    }

    /// The destination side of a cross-key move: applies a chunk of its
    /// documents (see `receiving.rs` and [`crate::moves::arrival`]).
    pub(super) fn move_in(&self, shard: &mut dyn Shard, msg: &Record, mv: &crate::command::moves::MoveIn) -> Step<Handled> {
        use crate::moves::Arrival;
        // The chunk as applied: without its files if its take-over timed out.
        let emptied;
        let mut mv = mv;
        let in_flight = self.receiving.borrow().in_flight();
        let pos = match crate::moves::arrival(shard.received(), in_flight.map(|(source, _)| source), mv) {
            Arrival::Duplicate => {
                counter!(m::MOVES_TOTAL, "side" => "destination", "outcome" => "duplicate").increment(1);
                debug!(partition = self.partition, offset = msg.offset(), source = ?mv.source(), chunk = mv.chunk, "a resent chunk of a move completed before: ignored");
                self.mark(shard, msg);
                return Ok(Handled::Done { fan_out: false });
            }
            Arrival::Waits => unreachable!("passed over by handle"),
            Arrival::Continues if self.receiving.borrow().destination() != Some(mv.to.as_str()) => {
                // Its source's, but not its destination: not a chunk of this
                // move (a worker writes one move's chunks alike).
                let origin = Origin { key: msg.key(), payload: msg.payload(), offset: msg.offset(), at: msg.offset() };
                let detail = format!("a chunk naming the source {:?} of the move in flight, but the destination {:?}, not the move's: not a part of it", mv.source(), mv.to);
                let handled = self.abort(shard, &origin, reason::INVALID_COMMAND, detail, 1, None)?;
                self.mark(shard, msg);
                return Ok(handled);
            }
            Arrival::Continues => in_flight.map(|(_, pos)| pos).expect("in flight"),
            Arrival::Starts if mv.aborted => {
                // The end of an attempt none of whose chunks is in flight
                // here (they were refused): nothing to end.
                self.mark(shard, msg);
                return Ok(Handled::Done { fan_out: false });
            }
            Arrival::Starts => {
                let from = crate::command::LogPosition { partition: mv.source_partition, offset: mv.source_offset };
                if let Awaited::TimedOut(detail) = self.await_departure(shard, from, msg.offset(), &format!("the move {:?} -> {:?}", mv.from, mv.to), false)? {
                    // Dead-lettered with its files; its part in the move is
                    // played without them (and without waiting), so that
                    // the move ends.
                    let origin = Origin { key: msg.key(), payload: msg.payload(), offset: msg.offset(), at: msg.offset() };
                    self.abort(shard, &origin, dlq::reason::TAKEOVER_TIMEOUT, detail, 1, None)?;
                    emptied = crate::command::moves::MoveIn { files: Vec::new(), ..mv.clone() };
                    mv = &emptied;
                }
                msg.offset() as u64
            }
        };
        if mv.aborted {
            // The source gave this attempt up: it is not received (a later
            // attempt of the rename starts it again). Where the source's
            // shard is another one, the files it brought are withdrawn:
            // the source still holds them. Where it is this shard, or
            // shards share documents (Elasticsearch), they were taken over
            // from the source's copy: they stay here, and a later attempt
            // moves the rest.
            let withdrawn = match mv.source_partition != self.partition && !shard.shares_documents() {
                true => crate::moves::withdraw_move(shard, mv, pos)?,
                false => 0,
            };
            counter!(m::MOVES_TOTAL, "side" => "destination", "outcome" => "aborted").increment(1);
            warn!(partition = self.partition, offset = msg.offset(), from = %crate::command::tenant::Shown(&mv.from), to = %crate::command::tenant::Shown(&mv.to), source = ?mv.source(), withdrawn, "a cross-key move its source gave up ended here (not received)");
            self.receiving.borrow_mut().void(mv.source(), msg.offset());
            self.end_move(shard, msg);
            return Ok(Handled::Done { fan_out: true });
        }
        let docs = crate::moves::move_in(shard, mv, pos)?;
        histogram!(m::COMMAND_DOCUMENTS, "type" => "move_in").record(docs as f64);
        if !mv.last {
            if self.receiving.borrow_mut().chunk(mv.source(), pos, &mv.to, Instant::now()) {
                info!(partition = self.partition, offset = msg.offset(), from = %crate::command::tenant::Shown(&mv.from), to = %crate::command::tenant::Shown(&mv.to), source = ?mv.source(), "a cross-key move spanning several messages started: the partition's other messages are passed over until its last chunk, then read again");
            }
            return Ok(Handled::Done { fan_out: false });
        }
        // The move is complete here.
        shard.received().insert(mv.source_partition, mv.source_offset);
        counter!(m::MOVES_TOTAL, "side" => "destination", "outcome" => "completed").increment(1);
        let age = (crate::clock::now_millis() - mv.issued_at).max(0) as f64 / 1000.0;
        histogram!(m::MOVE_SECONDS).record(age);
        info!(partition = self.partition, offset = msg.offset(), from = %crate::command::tenant::Shown(&mv.from), to = %crate::command::tenant::Shown(&mv.to), source = ?mv.source(), chunks = mv.chunk + 1, "cross-key move received");
        self.end_move(shard, msg);
        Ok(Handled::Done { fan_out: true })
    }

    /// Ends the move in flight if its next chunk has not come within
    /// `--wait-limit-secs` (a chunk `last: false` whose rest never comes,
    /// or a source that stopped writing): its documents are withdrawn
    /// where the source still holds them, as for an aborted end, and the
    /// partition is to be read again from its checkpoint, before the move,
    /// where its chunks are dead-lettered (`move_incomplete`) and the
    /// messages it passed over applied. Whether a move expired.
    pub(super) fn expire_move(&self, shard: &mut dyn Shard) -> Step<bool> {
        let Some(e) = self.receiving.borrow_mut().expire(Instant::now(), self.shared.cfg.wait_limit) else { return Ok(false) };
        let withdrawn = match e.source.0 != self.partition && !shard.shares_documents() {
            true => {
                let header = crate::command::moves::MoveIn {
                    move_id: String::new(),
                    source_partition: e.source.0,
                    source_offset: e.source.1,
                    from: String::new(),
                    to: e.to.clone(),
                    chunk: 0,
                    last: true,
                    issued_at: 0,
                    files: Vec::new(),
                    aborted: true,
                };
                crate::moves::withdraw_move(shard, &header, e.pos)?
            }
            false => 0,
        };
        counter!(m::MOVES_TOTAL, "side" => "destination", "outcome" => "expired").increment(1);
        warn!(
            partition = self.partition,
            to = %crate::command::tenant::Shown(&e.to),
            source = ?e.source,
            waited_secs = e.waited.as_secs(),
            withdrawn,
            "a cross-key move's next chunk did not come within --wait-limit-secs: the move is ended, its chunks are dead-lettered (move_incomplete) and the messages it held back applied"
        );
        Ok(true)
    }

    /// The move in flight ended at `msg`. Marked applied up to it if it
    /// passed nothing over; otherwise the partition is read again from the
    /// checkpoint (before its first chunk), once the shard committed.
    fn end_move(&self, shard: &mut dyn Shard, msg: &Record) {
        let passed_over = self.receiving.borrow_mut().end();
        if passed_over > 0 {
            debug!(partition = self.partition, offset = msg.offset(), passed_over, "the move ended: reading the messages it passed over again");
        } else {
            // Through the lanes' tracker, like every other message: marked
            // on the shard alone, the tracker's low mark stayed before the
            // move, and the next command finished while a lane was busy
            // recorded that mark, moving the checkpoint back (review of
            // lanes, F8).
            self.mark(shard, msg);
        }
    }

    /// Before a take-over (a cross-key move's first chunk, an owner
    /// change's upsert): waits until the partition the documents leave has
    /// applied its log up to `departure` (the rename, or the owner change's
    /// delete half), in this index. Live, the producer's barrier (a move's
    /// source commits before it writes the chunks) makes this so at once;
    /// a replay or a rebuild, whose partitions run at their own pace, then
    /// takes documents over in the order they changed owners, which is
    /// what Elasticsearch, where partitions share documents, needs (see
    /// docs/cross-key.md). Every dependency points at an earlier event of
    /// the live run, so waits never form a cycle; what this partition
    /// applied is committed first, for the partitions that wait for it.
    ///
    /// `itself`: the departure is a command of the key the documents leave
    /// that comes after all of that key's commands they depend on (an
    /// owner change's delete half), and is waited for itself: applied later
    /// than the take-over, it would delete the document where its new key
    /// put it, on Elasticsearch. Once it is recorded applied, so are the
    /// key's earlier commands (a key's commands apply in order), whatever
    /// another key's fan-out before it in that partition holds back (its
    /// lane keeps the checkpoint below). A move's rename is waited for up
    /// to the offset before it: its source marks it applied only after the
    /// destination's take-over may have begun.
    pub(super) fn await_departure(&self, shard: &mut dyn Shard, departure: crate::command::LogPosition, offset: i64, what: &str, itself: bool) -> Step<Awaited> {
        let (from, partition) = (departure.partition, self.partition);
        // This partition's own log orders it.
        if from == partition || !self.shared.cfg.takeover_waits {
            return Ok(Awaited::Departed);
        }
        if !(0..self.shared.log_partitions).contains(&from) {
            warn!(partition, offset, from, "{what} names partition {from}, which the topic does not have: applied without waiting");
            return Ok(Awaited::Departed);
        }
        // Whether the departure is applied, and the source's checkpoint.
        let ready = || -> Result<(bool, Option<u64>), IndexError> {
            let applied = self.shared.backend.applied(&[from])?.remove(&from).unwrap_or_default();
            let checkpoint = applied.checkpoint.map(|c| c.offset);
            let done = match itself {
                true => crate::moves::delete_half_applied(checkpoint, departure.offset) || applied.contains(departure.offset),
                false => crate::moves::departed(checkpoint, departure.offset),
            };
            Ok((done, checkpoint))
        };
        // The last offset the source must apply.
        let upto = if itself { departure.offset } else { departure.offset - 1 };
        let (done, mut seen) = ready()?;
        if done {
            return Ok(Awaited::Departed);
        }
        self.commit_before(shard)?;
        counter!(m::TAKEOVER_WAITS_TOTAL).increment(1);
        let target = (from, upto);
        self.shared.awaited.lock().expect("awaited lock").push(target);
        self.shared.awaiting.fetch_add(1, Ordering::SeqCst);
        let waiting = gauge!(m::TAKEOVERS_WAITING, "partition" => partition.to_string());
        waiting.set(1.0);
        info!(partition, offset, from, departure = departure.offset, "{what} waits until partition {from} is applied up to its departure (a replay or rebuild)");
        // Live, the limit counts from the start of the wait: the producer's
        // barrier makes a live departure applied already, so a long wait
        // means a position the log never reaches. In a replay it counts
        // from the source's last progress, since partitions run at their
        // own pace.
        let (limit, live) = (self.shared.cfg.wait_limit, matches!(self.shared.cfg.mode, crate::worker::Mode::Live));
        let started = Instant::now();
        let (mut said, mut progressed) = (started, started);
        let result = crate::retry::poll_until_done(Duration::from_millis(20), || {
            if self.stopping() {
                return Polled::Done(Err(Halt::Stopped));
            }
            match ready() {
                Ok((true, _)) => return Polled::Done(Ok(Awaited::Departed)),
                Ok((false, checkpoint)) if checkpoint != seen => (seen, progressed) = (checkpoint, Instant::now()),
                Ok((false, _)) => {}
                Err(e) => return Polled::Done(Err(e.into())),
            }
            if (if live { started } else { progressed }).elapsed() >= limit {
                let applied = seen.map_or_else(|| "nothing".to_string(), |c| format!("up to offset {c}"));
                let since = if live { "" } else { " without progress" };
                return Polled::Done(Ok(Awaited::TimedOut(format!(
                    "{what} waited {} s{since} for partition {from} to be applied up to offset {upto} (its departure), past --wait-limit-secs; partition {from} is applied {applied}",
                    started.elapsed().as_secs(),
                ))));
            }
            if said.elapsed() >= Duration::from_secs(60) {
                said = Instant::now();
                warn!(partition, offset, from, departure = departure.offset, waited_secs = started.elapsed().as_secs(), "{what} still waits for partition {from}: is a worker applying it?");
            }
            Polled::NotYet(())
        });
        {
            let mut awaited = self.shared.awaited.lock().expect("awaited lock");
            if let Some(i) = awaited.iter().position(|a| *a == target) {
                awaited.swap_remove(i);
            }
            self.shared.awaiting.fetch_sub(1, Ordering::SeqCst);
        }
        waiting.set(0.0);
        match &result {
            Ok(Awaited::Departed) => info!(partition, offset, from, ms = started.elapsed().as_millis() as u64, "{what}: partition {from} reached the departure, taking over"),
            Ok(Awaited::TimedOut(detail)) => warn!(partition, offset, from, "{detail}: dead-lettered"),
            Err(_) => {}
        }
        result
    }

    /// Whether a take-over of this process waits for this partition to pass
    /// an offset the batch has reached (it then commits at once).
    pub(super) fn awaited(&self, batch: &[Record]) -> bool {
        if self.shared.awaiting.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let Some(at) = batch.last().map(|m| m.offset()) else { return false };
        self.shared.awaited.lock().expect("awaited lock").iter().any(|&(p, o)| p == self.partition && o <= at)
    }

    /// Commits what the batch applied so far, before its last message: a
    /// take-over about to wait (another partition may be waiting for this
    /// one's progress), a cross-key rename about to write its chunks (whose
    /// destination waits for it), a fan-out about to scan (which would
    /// commit them itself, and take the blame for their refusal). A refusal
    /// for good is [`Halt::CommitFirst`].
    pub(super) fn commit_before(&self, shard: &mut dyn Shard) -> Step<()> {
        match shard.commit() {
            Ok(()) => Ok(()),
            Err(e) if e.is_retryable() => Err(Halt::Retry(Transient::Index(e))),
            Err(e) => Err(Halt::CommitFirst(e)),
        }
    }

    /// The source side of a cross-key rename (see [`crate::moves`]): the
    /// files under `from`, renamed, are written to the command topic keyed
    /// by the destination, in chunks, each acknowledged before the next;
    /// only then are they deleted here. A crash before this command is
    /// committed writes them again; the destination ignores a resend of a
    /// move it completed. Writing fails only transiently (retried here, like
    /// a dead letter). A renamed path that would not be valid refuses the
    /// rename ([`MoveOut::Invalid`]); an index failure is the caller's. A
    /// rename given up after its chunks were written ends the move with
    /// [`Applier::end_attempt`], so that the destination never waits for it.
    pub(super) fn move_out(&self, shard: &mut dyn Shard, e: &Envelope, from: &str, to: &str, pos: i64) -> Step<MoveOut> {
        let key = crate::command::path::top_level(to);
        let partition = crate::command::partitioner::partition_of(key, self.shared.log_partitions);
        // Everything before the rename is made durable first: the
        // destination takes the documents over once this partition is
        // applied up to here (`await_departure`).
        self.commit_before(shard)?;
        // Half the largest message a worker accepts, and at most 256 KiB,
        // well below the brokers' default limit of 1 MiB.
        let mut chunker = crate::command::moves::Chunker::new((self.shared.cfg.max_message_bytes / 2).clamp(1024, crate::command::moves::MAX_CHUNK_BYTES));
        let (mut ids, mut sent, mut halted, mut refused) = (Vec::new(), 0usize, None, None);
        let fail_after = crate::faults::active("move.fail-after-chunks").and_then(|n| n.trim().parse::<usize>().ok());
        let chunk = |files, last, i: usize| crate::command::moves::MoveIn {
            move_id: e.command_id.clone(),
            source_partition: self.partition,
            source_offset: pos,
            from: from.to_string(),
            to: to.to_string(),
            chunk: i as i32,
            last,
            issued_at: e.issued_at,
            files,
            aborted: false,
        };
        // Chunks are written as the scan fills them: only the files' ids
        // are kept, for the deletes.
        let scanned = crate::moves::move_out(shard, from, to, pos as u64, self.shared.cfg.fan_out, &mut |f| {
            if halted.is_some() || refused.is_some() {
                return;
            }
            if let Err(err) = crate::command::tenant::validate_path("path", &f.path) {
                refused = Some(MoveOut::Invalid { detail: format!("renaming {from:?} to {to:?} would make the path of file {:?} invalid: {err}", f.id), sent });
                return;
            }
            if fail_after.is_some_and(|n| sent >= n) {
                refused = Some(MoveOut::Failed { error: IndexError::Rejected("injected fault move.fail-after-chunks".into()), sent });
                return;
            }
            ids.push(f.id.clone());
            if let Some(full) = chunker.push(f) {
                match self.send_chunk(&chunk(full, false, sent), partition) {
                    Ok(Ok(())) => sent += 1,
                    Ok(Err(error)) => refused = Some(MoveOut::Failed { error, sent }),
                    Err(h) => halted = Some(h),
                }
            }
        });
        if let Some(h) = halted {
            return Err(h);
        }
        match (refused, scanned) {
            (Some(r), _) => return Ok(r),
            (None, Err(error)) => return Ok(MoveOut::Failed { error, sent }),
            (None, Ok(())) => {}
        }
        if ids.is_empty() {
            counter!(m::MOVES_TOTAL, "side" => "source", "outcome" => "empty").increment(1);
            return Ok(MoveOut::Moved(0));
        }
        if let Err(error) = self.send_chunk(&chunk(chunker.finish(), true, sent), partition)? {
            return Ok(MoveOut::Failed { error, sent });
        }
        if crate::faults::active("move.crash-after-send").is_some() {
            error!(partition = self.partition, offset = pos, "crashing after a move's documents were handed over (fault point move.crash-after-send)");
            std::process::abort();
        }
        counter!(m::MOVES_TOTAL, "side" => "source", "outcome" => "sent").increment(1);
        info!(partition = self.partition, offset = pos, from = %crate::command::tenant::Shown(from), to = %crate::command::tenant::Shown(to), files = ids.len(), chunks = sent + 1, to_partition = partition, "cross-key rename: documents handed to the destination");
        Ok(match crate::moves::remove_moved(shard, &ids, from, pos as u64) {
            Ok(_) => MoveOut::Moved(ids.len() as u64),
            // Every chunk was written: a retry writes the move again, a
            // resend the destination ignores.
            Err(error) => MoveOut::Failed { error, sent: 0 },
        })
    }

    /// A cross-key rename given up after `sent` chunks of its move were
    /// written: a last chunk marked aborted ends the move at the
    /// destination, which would otherwise wait for the rest for ever.
    pub(super) fn end_attempt(&self, e: &Envelope, from: &str, to: &str, pos: i64, sent: usize) -> Step<()> {
        if sent == 0 {
            return Ok(());
        }
        let partition = crate::command::partitioner::partition_of(crate::command::path::top_level(to), self.shared.log_partitions);
        let end = crate::command::moves::MoveIn {
            move_id: e.command_id.clone(),
            source_partition: self.partition,
            source_offset: pos,
            from: from.to_string(),
            to: to.to_string(),
            chunk: sent as i32,
            last: true,
            issued_at: e.issued_at,
            files: Vec::new(),
            aborted: true,
        };
        // Small (no files): never over a limit.
        self.send_chunk(&end, partition)?.map_err(|e| Halt::Fatal(WorkerError::Index(e)))?;
        counter!(m::MOVES_TOTAL, "side" => "source", "outcome" => "aborted").increment(1);
        warn!(partition = self.partition, offset = pos, from = %crate::command::tenant::Shown(from), to = %crate::command::tenant::Shown(to), chunks = sent, "cross-key rename given up after writing some of its documents: the move is ended as aborted at the destination");
        Ok(())
    }

    /// Writes one chunk of a move to the destination's partition and waits
    /// for the acknowledgement, retrying for as long as the topic fails. A
    /// chunk over the topic's message limit fails for good (`Ok(Err)`).
    pub(super) fn send_chunk(&self, mv: &crate::command::moves::MoveIn, partition: i32) -> Step<Result<(), IndexError>> {
        let payload = self.shared.codec.encode_move(mv);
        let mut retry = self.retrying(Op::Move);
        let at = loop {
            match self.shared.outbox.command(partition, mv.key().as_bytes(), &payload) {
                Ok(at) => break at,
                Err(err) if crate::dlq::writer::too_large(&err) => {
                    let detail = format!("a chunk of the move ({} bytes) is over the command topic's message limit: {err}", payload.len());
                    return Ok(Err(IndexError::Rejected(detail)));
                }
                Err(err) => retry.failed(&format_args!("{err} (topic {}, partition {partition}; nothing is committed past this rename meanwhile)", self.shared.cfg.kafka.topic))?,
            }
        };
        debug!(partition = self.partition, offset = mv.source_offset, to_partition = partition, to_offset = at, chunk = mv.chunk, "cross-key move chunk written");
        if !mv.last && crate::faults::active("move.pause-between-chunks").is_some() {
            info!(partition = self.partition, offset = mv.source_offset, chunk = mv.chunk, "paused between a move's chunks (fault point move.pause-between-chunks)");
            crate::faults::reached_with("move.pause-between-chunks", &format!("{} -> {}", mv.from, mv.to));
            while crate::faults::active("move.pause-between-chunks").is_some() && !self.stopping() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(Ok(()))
    }
}
