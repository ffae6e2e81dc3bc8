//! What an applier publishes to the consumer thread, a part with its own
//! state (issue 45): the next offset whose predecessors are durably
//! applied and searchable, what is applied above it, and the end of the
//! partition the consumer reported, which is published once everything
//! before it is.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use crate::index::progress::DoneAbove;
use crate::index::Checkpoint;

/// See the module's doc.
pub(super) struct Publication {
    /// See [`super::Partition::next`].
    next: Arc<AtomicI64>,
    /// See [`super::Partition::done`].
    done: Arc<Mutex<DoneAbove>>,
    /// An offset committed to the index but not published yet, until its
    /// writes are searchable.
    unpublished: Option<i64>,
    /// The end of the partition the consumer last reported, while no
    /// message came after it: once everything before it is applied, the
    /// offset published goes there, past offsets without messages
    /// (transaction markers).
    end: Option<i64>,
}

impl Publication {
    pub fn new(next: Arc<AtomicI64>, done: Arc<Mutex<DoneAbove>>) -> Publication {
        Publication { next, done, unpublished: None, end: None }
    }

    /// A shard was opened at `checkpoint`: what a previous writer kept
    /// unpublished is below it, or of another generation. Never published
    /// past it; up to it once the shard says it is searchable (on
    /// Elasticsearch a previous writer's last writes may not be: review of
    /// Elasticsearch, F4).
    pub fn opened(&mut self, checkpoint: Option<Checkpoint>) {
        self.unpublished = None;
        // The end reported was of the reading of the shard before (another
        // generation's, whose checkpoint may be ahead of this one's).
        self.end = None;
        if let Some(c) = checkpoint {
            self.next.fetch_min(c.offset as i64 + 1, Ordering::SeqCst);
            self.unpublished = Some(c.offset as i64 + 1);
        }
    }

    /// The shard committed, its checkpoint at `checkpoint`: the offset
    /// after it waits until the commit is searchable.
    pub fn committed(&mut self, checkpoint: Option<Checkpoint>) {
        if let Some(c) = checkpoint {
            self.unpublished = Some(c.offset as i64 + 1);
        }
    }

    /// Whether a commit waits to be searchable.
    pub fn waiting(&self) -> bool {
        self.unpublished.is_some()
    }

    /// The commit waiting is searchable, recording `done` above its
    /// checkpoint: both are published.
    pub fn searchable(&mut self, done: &DoneAbove) {
        if let Some(next) = self.unpublished.take() {
            *self.done.lock().expect("done lock") = done.clone();
            self.next.fetch_max(next, Ordering::SeqCst);
        }
    }

    /// The consumer reported the partition's end at `at`.
    pub fn end_reported(&mut self, at: i64) {
        self.end = Some(at);
    }

    /// A message at `offset` was read: an end at or before it is stale. One
    /// before it is not: a lane's waiting messages, handled again when its
    /// fan-out finishes, are older than an end reported meanwhile (review
    /// of lanes, F1: a tail without messages was never published past).
    pub fn read(&mut self, offset: i64) {
        if self.end.is_some_and(|e| offset >= e) {
            self.end = None;
        }
    }

    /// The end reported is of a reading that is over (the partition is
    /// read again from its checkpoint, or positioned anew).
    pub fn forget_end(&mut self) {
        self.end = None;
    }

    /// With every commit published and nothing else in flight (`idle`: no
    /// batch open, no move, no fan-out in a lane), publishes the end of
    /// the partition reported.
    pub fn publish_end(&self, idle: bool) {
        if let (Some(end), None, true) = (self.end, self.unpublished, idle) {
            self.next.fetch_max(end, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part() -> (Publication, Arc<AtomicI64>) {
        let next = Arc::new(AtomicI64::new(-1));
        (Publication::new(next.clone(), Arc::default()), next)
    }

    fn at(offset: u64) -> Option<Checkpoint> {
        Some(Checkpoint::new(offset, 0))
    }

    #[test]
    fn a_commit_is_published_once_searchable_and_the_end_only_after_it() {
        let (mut p, next) = part();
        p.committed(at(9));
        p.end_reported(12);
        p.publish_end(true);
        assert_eq!(next.load(Ordering::SeqCst), -1, "the commit is not searchable yet");
        p.searchable(&DoneAbove::default());
        assert_eq!(next.load(Ordering::SeqCst), 10);
        p.publish_end(false);
        assert_eq!(next.load(Ordering::SeqCst), 10, "not while something is in flight");
        p.publish_end(true);
        assert_eq!(next.load(Ordering::SeqCst), 12, "past the offsets without messages");
    }

    #[test]
    fn a_message_at_or_past_the_end_makes_it_stale_and_one_before_does_not() {
        let (mut p, next) = part();
        p.end_reported(12);
        p.read(8);
        p.publish_end(true);
        assert_eq!(next.load(Ordering::SeqCst), 12, "a lane's older message leaves the end");
        p.end_reported(20);
        p.read(20);
        p.publish_end(true);
        assert_eq!(next.load(Ordering::SeqCst), 12);
        p.end_reported(25);
        p.forget_end();
        p.publish_end(true);
        assert_eq!(next.load(Ordering::SeqCst), 12);
    }

    /// A shard of a new generation opened while the old reading's end is
    /// known: the idle partition publishes nothing past the new checkpoint
    /// before it is read again.
    #[test]
    fn an_end_reported_before_a_shard_is_opened_is_not_published_after_it() {
        let (mut p, next) = part();
        p.committed(at(49));
        p.searchable(&DoneAbove::default());
        p.end_reported(60);
        p.opened(at(9));
        p.searchable(&DoneAbove::default());
        p.publish_end(true);
        assert_eq!(next.load(Ordering::SeqCst), 10, "the old reading's end published past the new shard's checkpoint");
    }

    #[test]
    fn opening_a_shard_never_publishes_past_its_checkpoint() {
        let (mut p, next) = part();
        next.store(50, Ordering::SeqCst);
        p.opened(at(30));
        assert_eq!(next.load(Ordering::SeqCst), 31, "back to the checkpoint");
        assert!(p.waiting());
        p.opened(None);
        assert!(!p.waiting());
    }
}
