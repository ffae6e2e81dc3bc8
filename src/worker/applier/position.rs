//! Where a partition resumes: the shard's checkpoint, checked against the
//! log (the log's identity, gaps, the partition count), and following the
//! index to a new generation.

use super::*;

impl Applier {
    /// After [`Halt::Moved`]: the batch is dropped (its commands reach the
    /// new generation from its checkpoint) and the partition sought there.
    pub(super) fn moved(&self, shard: &mut ShardBox, batch: &mut Vec<Record>) -> Option<Checkpoint> {
        info!(partition = self.partition, dropped = batch.len(), generation = shard.generation(), "the index moved to a new generation during a batch: resuming at its checkpoint");
        batch.clear();
        self.reset_incoming();
        self.clear_lanes();
        let checkpoint = self.took(shard.as_mut());
        self.seek_to(checkpoint);
        checkpoint
    }

    /// A shard was opened: the offset after its checkpoint is what may be
    /// committed, and where fetching goes on. Returns the checkpoint.
    pub(super) fn took(&self, shard: &mut dyn Shard) -> Option<Checkpoint> {
        let checkpoint = shard.checkpoint();
        // Published up to it once the shard says it is searchable (the
        // embedded index's commits are at once).
        self.publication.borrow_mut().opened(checkpoint);
        if checkpoint.is_some() {
            self.publish_pending(shard, false);
        }
        self.parked_gauge(shard);
        info!(partition = self.partition, applied = ?checkpoint.map(|c| c.offset), parked = shard.parking().len(), generation = shard.generation(), "partition assigned, shard open");
        checkpoint
    }

    /// The index decides where to resume: asks the consumer thread to fetch
    /// from the shard's checkpoint itself, whose message must still be the
    /// one the index applied (see `crate::logid`). Not positioned until the
    /// consumer thread says so ([`Feed::Positioned`]).
    pub(super) fn seek_to(&self, checkpoint: Option<Checkpoint>) -> bool {
        self.drop_held();
        self.lanes.borrow_mut().tracker.reset_at(checkpoint);
        self.seek(target_of(checkpoint));
        false
    }

    /// Asks the consumer thread to position the partition at `target`.
    pub(super) fn seek(&self, target: Offset) {
        self.reading.set(Reading::asked(target));
        self.shared.seeks.lock().expect("seeks lock").insert(self.partition, (self.id, target));
    }

    /// What the consumer thread delivers, as received (before it is
    /// handled): `None` for a message delivered again ([`Reading::again`]),
    /// which leaves the queue's count here.
    pub(super) fn received(&self, feed: Feed) -> Option<Feed> {
        let mut reading = self.reading.get();
        let taken = reading.take(&feed);
        self.reading.set(reading);
        match (taken, feed) {
            (Taken::Again, Feed::Message(m)) => {
                self.queued.take(queued_size(&m));
                debug!(partition = self.partition, offset = m.offset(), read_to = ?reading.read_to, "a message delivered again after a late seek: dropped");
                None
            }
            (Taken::Superseded | Taken::Behind, Feed::Positioned(at)) => {
                debug!(partition = self.partition, ?at, asked = ?reading.asked, read_to = ?reading.read_to, "a positioning not the one awaited, at or before what was read: ignored");
                None
            }
            (_, feed) => Some(feed),
        }
    }

    /// A [`Feed::Positioned`] as the loop takes it: where the reading was
    /// positioned by a seek this applier did not ask for, past the offset
    /// it needs next, the partition stops (reading on would skip the
    /// offsets between); otherwise the partition is positioned.
    pub(super) fn positioned_by(&self, at: Offset, checkpoint: Option<Checkpoint>) -> Step<bool> {
        if let Some(next) = self.reading.get().stray {
            return Err(Halt::Fatal(WorkerError::Gap {
                partition: self.partition,
                detail: format!(
                    "the consumer positioned the partition at {at:?}, which this applier did not ask for, past the offset it needs next ({}): \
                     reading on from there would skip the offsets between, so the partition stops",
                    next.map_or("unknown".to_string(), |n| n.to_string())
                ),
            }));
        }
        self.positioned(checkpoint)
    }

    /// The partition fetches from the checkpoint now; its watermarks, when
    /// they can be read, say at once whether the checkpoint is in the log
    /// (some brokers, tansu, answer a fetch past the end with nothing
    /// rather than an out-of-range error). Read here, on the applier's
    /// thread: the consumer thread never waits on the network.
    pub(super) fn positioned(&self, checkpoint: Option<Checkpoint>) -> Step<bool> {
        self.publication.borrow_mut().forget_end();
        if let Some((low, high)) = self.shared.probe.watermarks(self.partition) {
            self.low.set(Some(low));
            self.judge(checkpoint, crate::logid::range_against(checkpoint, low, high))?;
        }
        Ok(true)
    }

    /// Moves to the backend's current generation when the shard is of
    /// another one (a rebuild's cutover): the old writer is released, the
    /// new generation's shard opened (waiting while the rebuild still holds
    /// it). Whether it moved; the caller positions the partition anew.
    pub(super) fn follow_generation(&self, shard: &mut ShardBox) -> Step<bool> {
        let now = match self.shared.backend.generation() {
            Ok(g) => g,
            Err(e) => {
                debug!(partition = self.partition, error = %e, "reading the index generation failed; checked again later");
                return Ok(false);
            }
        };
        let was = shard.generation();
        if now == was {
            return Ok(false);
        }
        if !self.bound()? {
            return Ok(false);
        }
        *shard = Box::new(crate::index::memory::MemoryShard::new());
        *shard = self.open_shard()?;
        info!(partition = self.partition, from = was, to = now, "the index moved to a new generation: following it");
        Ok(true)
    }

    /// Whether this worker's topic is the one the current generation was
    /// built from: it may have been rebuilt from another topic (after
    /// `denorm migrate`), and then this worker must not write to it (fatal).
    /// `false` when the binding could not be read (checked again later).
    pub(super) fn bound(&self) -> Step<bool> {
        match self.shared.backend.bind_log(self.shared.log_partitions) {
            Ok(()) => Ok(true),
            Err(e) if e.is_retryable() => {
                debug!(partition = self.partition, error = %e, "reading the index's log binding failed; checked again later");
                Ok(false)
            }
            Err(e) => Err(Halt::Fatal(WorkerError::Index(e))),
        }
    }

    /// What the first message fetched from the checkpoint, or the
    /// partition's watermarks before any, say about the log (see
    /// [`crate::logid`]): a changed log ends the worker, a gap stops the
    /// partition.
    pub(super) fn judge(&self, checkpoint: Option<Checkpoint>, verdict: crate::logid::First) -> Step<()> {
        use crate::logid::First;
        match verdict {
            First::Same => Ok(()),
            First::Unverifiable => {
                warn!(partition = self.partition, checkpoint = ?checkpoint.map(|c| c.offset), "the checkpoint's message was deleted by retention: the log's identity cannot be checked");
                Ok(())
            }
            First::Changed(detail) => {
                let at = checkpoint.map_or(0, |c| c.offset);
                Err(Halt::Fatal(WorkerError::Index(IndexError::log_changed(self.partition, at, &detail))))
            }
            First::Gap { from, to } if self.shared.cfg.mode.accepts_gaps() => {
                warn!(
                    partition = self.partition,
                    from, to, "offsets {from}..{to} are no longer in the topic (retention deleted them): applying what is left (--accept-gaps); the index lacks their effects"
                );
                Ok(())
            }
            First::Gap { from, to } => Err(self.gap(from, to)),
            First::Misplaced { sought, offset } => Err(Halt::Fatal(WorkerError::Gap {
                partition: self.partition,
                detail: format!(
                    "sought at the checkpoint's offset {sought}, which the log keeps, the partition was read from offset {offset} after {} seeks: \
                     the consumer did not start where it was positioned, and taking it would skip offsets {}..{offset}; the partition stops",
                    batch::RESEEKS + 1,
                    sought + 1
                ),
            })),
        }
    }

    /// Offsets `from..to` are gone (retention) before the index applied
    /// them: the partition stops, since skipping them would leave the index
    /// silently wrong.
    pub(super) fn gap(&self, from: i64, to: i64) -> Halt {
        Halt::Fatal(WorkerError::Gap {
            partition: self.partition,
            detail: format!(
                "offsets {from}..{} are no longer in the topic (retention deleted them) and the index never applied them; \
                 a rebuild cannot be exact either: restore the index from a copy whose checkpoint is at or after offset {}, or accept the loss by \
                 rebuilding from what is left (`denorm rebuild --accept-gaps`)",
                to - 1,
                to - 1
            ),
        })
    }

    /// Opens the shard, waiting while a previous owner still holds it.
    pub(super) fn open_shard(&self) -> Step<ShardBox> {
        let mut retry = self.retrying(Op::Open);
        loop {
            match self.shared.backend.open_shard(self.partition) {
                Ok(s) => return Ok(s),
                Err(e @ IndexError::Locked(_)) => {
                    debug!(partition = self.partition, error = %e, "waiting for shard");
                    retry.pause()?;
                }
                Err(e) if e.is_retryable() => retry.failed(&e)?,
                Err(e) => return Err(Halt::Fatal(e.into())),
            }
        }
    }
}

/// Where the partition's reading stands: the seek asked and not yet seen
/// positioned, and the highest offset received since it was. A part of
/// its own (issue 45): it knows nothing of the applier.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(super) struct Reading {
    asked: Option<Offset>,
    /// Where the partition was last positioned as asked (`None` for the
    /// log's beginning, or when not known).
    from: Option<i64>,
    read_to: Option<i64>,
    /// Set by a positioning nobody asked for past what was read: the offset
    /// that was needed next (`None`: not known).
    stray: Option<Option<i64>>,
}

/// What [`Reading::take`] made of a feed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Taken {
    /// To handle: a message not read before, the positioning awaited, an end.
    New,
    /// A message at or below one read since the positioning.
    Again,
    /// A positioning of an earlier seek of this applier's, which a later
    /// one replaced: the reading waits for the later one.
    Superseded,
    /// A positioning nobody awaited, at or before the offset needed next:
    /// what it delivers again is [`Taken::Again`].
    Behind,
    /// A positioning nobody awaited, past the offset needed next.
    Stray,
}

impl Reading {
    /// A seek to `target` was asked: until the consumer thread says the
    /// partition is positioned there, what comes is from the old position.
    pub fn asked(target: Offset) -> Reading {
        Reading { asked: Some(target), ..Reading::default() }
    }

    /// Positioned at `target` without a seek (the assignment started it there).
    pub fn started_at(target: Offset) -> Reading {
        Reading { from: offset_of(target), ..Reading::default() }
    }

    /// Takes in `feed`, as received; whether it is a message at or below
    /// one received since the partition was positioned where this applier
    /// last asked. Such a message was delivered again without a seek of
    /// the applier's: a seek it asked for, served and seen positioned, that
    /// took effect late in the client (seen on tansu right after an
    /// assignment: the client's own start from the group's offset came
    /// first, then the seek read the same messages again a second later).
    /// Handled twice, a fan-out already running in its key's lane was
    /// started again beside itself and the partition never published
    /// again. Messages before the positioning asked are not judged here:
    /// the loop drops them.
    #[cfg(test)]
    pub fn again(&mut self, feed: &Feed) -> bool {
        self.take(feed) == Taken::Again
    }

    /// Takes in `feed`, as received: see [`Taken`]. A positioning at the
    /// seek asked starts a new reading there; one nobody asked for (a seek
    /// served late, or asked by another applier of the partition) is
    /// harmless at or before the offset needed next, and a skip after it.
    pub fn take(&mut self, feed: &Feed) -> Taken {
        match feed {
            Feed::Positioned(at) if self.asked == Some(*at) => {
                *self = Reading::started_at(*at);
                Taken::New
            }
            Feed::Positioned(_) if self.asked.is_some() => Taken::Superseded,
            Feed::Positioned(at) => {
                let next = self.read_to.map(|r| r + 1).or(self.from);
                match (offset_of(*at), next) {
                    (None, _) => Taken::Behind,
                    (Some(o), Some(n)) if o <= n => Taken::Behind,
                    _ => {
                        self.stray = Some(next);
                        Taken::Stray
                    }
                }
            }
            Feed::Message(_) if self.asked.is_some() => Taken::New,
            Feed::Message(m) => {
                if self.read_to.is_some_and(|r| m.offset() <= r) {
                    return Taken::Again;
                }
                self.read_to = Some(m.offset());
                Taken::New
            }
            Feed::End(_) => Taken::New,
        }
    }
}

/// The offset `target` names (`None` for the log's beginning or end).
fn offset_of(target: Offset) -> Option<i64> {
    match target {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

#[cfg(test)]
mod reading_tests {
    use super::*;

    fn msg(offset: i64) -> Feed {
        Feed::Message(Record { offset, key: None, payload: None, timestamp_ms: None, signature: None })
    }

    #[test]
    fn a_message_at_or_below_one_read_since_the_positioning_is_delivered_again() {
        let mut r = Reading::asked(Offset::Offset(10));
        // From the old position, before the seek took effect: not judged.
        assert!(!r.again(&msg(3)));
        assert!(!r.again(&msg(4)));
        // Positioned elsewhere than asked: still waiting.
        assert!(!r.again(&Feed::Positioned(Offset::Offset(4))));
        assert!(!r.again(&msg(4)));
        assert!(!r.again(&Feed::Positioned(Offset::Offset(10))));
        assert!(!r.again(&msg(10)));
        assert!(!r.again(&msg(11)));
        assert!(!r.again(&Feed::End(12)));
        // The late seek read 10 and 11 again.
        assert!(r.again(&msg(10)));
        assert!(r.again(&msg(11)));
        assert!(!r.again(&msg(12)));
    }

    #[test]
    fn a_positioning_nobody_asked_for_is_harmless_behind_the_reading_and_a_stray_past_it() {
        let mut r = Reading::asked(Offset::Offset(10));
        assert_eq!(r.take(&Feed::Positioned(Offset::Offset(4))), Taken::Superseded, "an earlier seek's");
        assert_eq!(r.take(&Feed::Positioned(Offset::Offset(10))), Taken::New);
        assert_eq!(r.take(&Feed::Positioned(Offset::Offset(10))), Taken::Behind, "nothing read yet: at the offset needed");
        assert!(!r.again(&msg(10)));
        assert!(!r.again(&msg(11)));
        assert_eq!(r.take(&Feed::Positioned(Offset::Offset(12))), Taken::Behind, "at the offset needed next");
        assert_eq!(r.take(&Feed::Positioned(Offset::Beginning)), Taken::Behind);
        assert_eq!(r.stray, None);
        assert_eq!(r.take(&Feed::Positioned(Offset::Offset(13))), Taken::Stray, "12 would be skipped");
        assert_eq!(r.stray, Some(Some(12)));
        let mut started = Reading::started_at(Offset::Offset(7));
        assert_eq!(started.take(&Feed::Positioned(Offset::Offset(9))), Taken::Stray);
    }

    #[test]
    fn a_new_seek_forgets_what_was_read() {
        let mut r = Reading::default();
        assert!(!r.again(&msg(5)));
        assert!(r.again(&msg(5)));
        r = Reading::asked(Offset::Offset(2));
        assert!(!r.again(&Feed::Positioned(Offset::Offset(2))));
        assert!(!r.again(&msg(2)), "read again because it was asked, not delivered again");
        assert!(!r.again(&msg(5)));
    }
}
