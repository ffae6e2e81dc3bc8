//! Recovery: what is retried and how (backoff, degraded health), reopening
//! the shard after a failure, and isolating the command at fault in a batch
//! the index refused to commit.

use super::*;

/// What is being retried: its log text and its retry counter.
#[derive(Clone, Copy)]
pub(super) enum Op {
    Open,
    Apply,
    Reapply,
    Commit,
    Isolate,
    /// A command the index refused, tried again up to `--max-attempts`.
    Rejected,
    DeadLetter,
    /// Writing a cross-key move's documents to the command topic.
    Move,
}

impl Op {
    pub(super) fn describe(self) -> &'static str {
        match self {
            Op::Open => "opening the shard",
            Op::Apply => "applying the command",
            Op::Reapply => "re-applying after an index failure",
            Op::Commit => "index commit",
            Op::Isolate => "committing the command",
            Op::Rejected => "applying the command (the index refused it)",
            Op::DeadLetter => "writing to the dead-letter topic",
            Op::Move => "writing a cross-key move's documents to the command topic",
        }
    }

    pub(super) fn count(self) {
        match self {
            Op::Apply => counter!(m::INDEX_RETRIES_TOTAL, "operation" => "apply").increment(1),
            Op::Commit => counter!(m::INDEX_RETRIES_TOTAL, "operation" => "commit").increment(1),
            Op::DeadLetter => counter!(m::DEAD_LETTER_RETRIES_TOTAL).increment(1),
            Op::Open | Op::Reapply | Op::Isolate | Op::Rejected | Op::Move => {}
        }
    }
}

/// The retry state of one operation: jittered backoff, and the partition
/// reported degraded from its first failure until the operation is over.
pub(super) struct Retrying<'a> {
    pub(super) applier: &'a Applier,
    pub(super) op: Op,
    pub(super) backoff: Backoff,
    pub(super) degraded: Option<crate::http::Degraded<'a>>,
}

impl Retrying<'_> {
    /// After a failure: reports the partition degraded (unless the index is
    /// refusing one command, which is no outage), counts and logs the
    /// failure, and waits. `Halt::Stopped` when stop was requested.
    pub(super) fn failed(&mut self, error: &dyn std::fmt::Display) -> Step<()> {
        let a = self.applier;
        if !matches!(self.op, Op::Isolate | Op::Rejected) {
            self.degraded.get_or_insert_with(|| a.shared.health.degrade());
        }
        self.op.count();
        warn!(partition = a.partition, error = %error, "{} failed, retrying", self.op.describe());
        self.pause()
    }

    /// Waits for an expected condition (another owner releasing the shard):
    /// not a failure. `Halt::Stopped` when stop was requested.
    pub(super) fn pause(&mut self) -> Step<()> {
        let a = self.applier;
        if self.backoff.wait_unless(|| a.stopping()) {
            Ok(())
        } else {
            Err(Halt::Stopped)
        }
    }
}

impl Applier {
    /// Replaces the shard writer with a fresh one (back at the last commit)
    /// and handles `replay` again.
    pub(super) fn reopen(&self, shard: &mut ShardBox, replay: &[Record]) -> Step<()> {
        let mut retry = self.retrying(Op::Reapply);
        let generation = shard.generation();
        // Re-applied one at a time (never into a lane), from the last
        // commit: what was finished since is finished again.
        self.lanes.borrow_mut().allow_deferring(false);
        self.lanes.borrow_mut().tracker.reset();
        'open: loop {
            // The old writer must go first: it holds the shard's lock.
            *shard = Box::new(crate::index::memory::MemoryShard::new());
            *shard = self.open_shard()?;
            // Back at the last commit: so is the move in flight, and it is
            // decided again from the replayed messages.
            self.back_at_commit();
            if shard.generation() != generation {
                match self.bound()? {
                    true => return Err(Halt::Moved),
                    false => {
                        retry.failed(&"reading the index's log binding failed")?;
                        continue 'open;
                    }
                }
            }
            for msg in replay {
                match self.handle(shard.as_mut(), msg) {
                    Ok(_) => {}
                    Err(Halt::Retry(e)) => {
                        retry.failed(&e)?;
                        continue 'open;
                    }
                    Err(halt) => return Err(halt),
                }
            }
            info!(partition = self.partition, reapplied = replay.len(), "shard reopened after an index failure");
            return Ok(());
        }
    }

    /// After a commit the index refused for good: applies and commits the
    /// batch one message at a time from a fresh writer; the command whose
    /// commit is refused `max_attempts` times is aborted. Publishes
    /// progress after each message. A cross-key move in flight is committed
    /// chunk by chunk too (its checkpoint staying before it), so the
    /// command at fault is found in it as well.
    pub(super) fn isolate(&self, shard: &mut ShardBox, batch: &mut Vec<Record>) -> Step<()> {
        // A fresh writer back at the last commit; again after every failure.
        self.reopen(shard, &[])?;
        while let Some(msg) = batch.first() {
            let mut retry = self.retrying(Op::Isolate);
            let mut attempts = 0u32;
            let mut abort_with: Option<IndexError> = None;
            loop {
                let handled = match &abort_with {
                    None => self.handle(shard.as_mut(), msg),
                    Some(e) => self.abort_message(shard.as_mut(), msg, e, attempts),
                };
                let refused = match handled {
                    Err(Halt::Retry(e)) => Err(e.to_string()),
                    // The commit before a cross-key step, refused: this
                    // message is the last uncommitted one.
                    Err(Halt::CommitFirst(e)) => Ok(e),
                    Err(halt) => return Err(halt),
                    Ok(_) => match shard.commit() {
                        Ok(()) => break,
                        Err(e) if !e.is_retryable() => Ok(e),
                        Err(e) => Err(e.to_string()),
                    },
                };
                let failure = match refused {
                    Ok(e) if abort_with.is_none() => {
                        attempts += 1;
                        let shown = e.to_string();
                        if attempts >= self.shared.cfg.max_attempts.max(1) {
                            abort_with = Some(e);
                        }
                        shown
                    }
                    Ok(e) => e.to_string(),
                    Err(shown) => shown,
                };
                retry.failed(&format_args!("{failure} (offset {}, attempt {attempts})", msg.offset()))?;
                self.reopen(shard, &[])?;
            }
            self.committed();
            self.publish_checkpoint(shard.as_mut());
            batch.remove(0);
            if self.receiving.borrow().rewind_due() {
                // A move ended that passed messages over: they (and what
                // follows) are read again.
                batch.clear();
            }
        }
        self.parked_gauge(shard.as_mut());
        self.publish_end();
        Ok(())
    }
}
