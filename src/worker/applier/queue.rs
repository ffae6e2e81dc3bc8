//! The queue from the consumer thread to one partition's applier, bounded
//! by bytes by its type (issue 45): the consumer thread's side can only
//! [`FeedQueue::offer`], which refuses a feed while the queue holds
//! `--queue-kb` or more, and hands it back to be held (the partition is
//! paused meanwhile). The applier counts a message out when it takes it,
//! and back in while it waits in a key lane.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use rdkafka::Offset;

use super::{Feed, Record};

/// The messages in an applier's queue not yet taken by it: their bytes
/// ([`queued_size`] each, what `--queue-kb` bounds) and their number.
#[derive(Default)]
pub(crate) struct Queued {
    bytes: AtomicUsize,
    messages: AtomicUsize,
}

impl Queued {
    /// A message of `size` bytes was queued.
    pub fn add(&self, size: usize) {
        self.bytes.fetch_add(size, Ordering::SeqCst);
        self.messages.fetch_add(1, Ordering::SeqCst);
    }

    /// A message of `size` bytes left the queue.
    pub fn take(&self, size: usize) {
        self.bytes.fetch_sub(size, Ordering::SeqCst);
        self.messages.fetch_sub(1, Ordering::SeqCst);
    }

    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::SeqCst)
    }

    pub fn messages(&self) -> usize {
        self.messages.load(Ordering::SeqCst)
    }
}

/// What a queued message counts against `--queue-kb`: its key and payload
/// plus the bookkeeping of one message.
pub(crate) fn queued_size(m: &Record) -> usize {
    m.payload().map_or(0, <[u8]>::len) + m.key().map_or(0, <[u8]>::len) + 256
}

/// Why [`FeedQueue::offer`] handed a feed back.
pub(crate) enum Refused {
    /// The queue holds its bound: hold the feed, offer it again later.
    Full(Feed),
    /// The applier has ended.
    Ended(Feed),
}

/// The consumer thread's side of the queue.
#[derive(Clone)]
pub(crate) struct FeedQueue {
    tx: Sender<Feed>,
    queued: Arc<Queued>,
    limit: usize,
}

/// A queue bounded at `limit` bytes (at least 1): its sending side, and
/// the applier's.
pub(crate) fn feed_queue(limit: usize) -> (FeedQueue, Receiver<Feed>) {
    let (tx, rx) = std::sync::mpsc::channel();
    (FeedQueue { tx, queued: Arc::default(), limit: limit.max(1) }, rx)
}

impl FeedQueue {
    /// Queues `feed`, in order, unless the queue holds `limit` bytes or
    /// more already (a message may take it past the bound by its own size,
    /// never more).
    pub fn offer(&self, feed: Feed) -> Result<(), Refused> {
        if self.queued.bytes() >= self.limit {
            return Err(Refused::Full(feed));
        }
        self.send(feed).map_err(Refused::Ended)
    }

    /// Tells the applier the partition is positioned at `offset`: never
    /// refused for size (what was held before it is stale, dropped by the
    /// caller). Whether the applier is still there.
    pub fn positioned(&self, offset: Offset) -> bool {
        self.tx.send(Feed::Positioned(offset)).is_ok()
    }

    /// What the queue holds.
    pub fn queued(&self) -> &Arc<Queued> {
        &self.queued
    }

    /// Whether the queue holds at most half its bound: where a paused
    /// partition is resumed.
    pub fn below_half(&self) -> bool {
        self.queued.bytes() <= self.limit / 2
    }

    fn send(&self, feed: Feed) -> Result<(), Feed> {
        let size = match &feed {
            Feed::Message(m) => Some(queued_size(m)),
            _ => None,
        };
        size.inspect(|s| self.queued.add(*s));
        self.tx.send(feed).map_err(|std::sync::mpsc::SendError(feed)| {
            size.inspect(|s| self.queued.take(*s));
            feed
        })
    }

    /// Queues `feed` past the bound: the applier's tests play a consumer
    /// that does not pause.
    #[cfg(test)]
    pub fn send_unbounded(&self, feed: Feed) -> bool {
        self.send(feed).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(offset: i64, bytes: usize) -> Feed {
        Feed::Message(Record { offset, key: None, payload: Some(vec![0; bytes]), timestamp_ms: None, signature: None })
    }

    fn offset_of(f: Feed) -> i64 {
        match f {
            Feed::Message(m) => m.offset,
            _ => panic!("not a message"),
        }
    }

    #[test]
    fn the_queue_refuses_feeds_once_it_holds_its_bound_and_takes_them_again_as_the_applier_drains_it() {
        let (q, rx) = feed_queue(1000);
        assert!(q.offer(msg(0, 400)).is_ok(), "656 bytes");
        assert!(q.offer(msg(1, 400)).is_ok(), "under the bound when offered: 1,312 bytes after");
        assert_eq!(q.queued().bytes(), 2 * (400 + 256));
        let Err(Refused::Full(back)) = q.offer(msg(2, 1)) else { panic!("not refused") };
        assert_eq!(offset_of(back), 2, "the feed is handed back");
        assert!(matches!(q.offer(Feed::End(3)), Err(Refused::Full(_))), "markers keep their place behind held messages");
        assert!(!q.below_half());
        // The applier takes one (and counts it out).
        let Ok(Feed::Message(m)) = rx.try_recv() else { panic!("nothing queued") };
        q.queued().take(queued_size(&m));
        assert!(q.offer(msg(2, 1)).is_ok());
        assert_eq!(q.queued().messages(), 2);
        assert!(q.positioned(Offset::Offset(7)), "a positioning is never refused");
        let Ok(Feed::Message(m)) = rx.try_recv() else { panic!() };
        q.queued().take(queued_size(&m));
        assert!(q.below_half(), "257 bytes left of 1,000");
    }

    #[test]
    fn a_feed_for_an_ended_applier_is_handed_back_and_not_counted() {
        let (q, rx) = feed_queue(1000);
        drop(rx);
        assert!(matches!(q.offer(msg(0, 10)), Err(Refused::Ended(_))));
        assert_eq!(q.queued().bytes(), 0);
        assert!(!q.positioned(Offset::Beginning));
    }
}
