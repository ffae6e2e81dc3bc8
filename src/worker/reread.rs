//! The consumer thread's second readers (issue 47): a flooding tenant's
//! messages spilled past the hold ([`super::applier`]'s `spill.rs`) are
//! read again by a client of their own, so that the partition's own
//! reading goes on forward and is never sought back for them.
//!
//! An applier asks for a rereading (its number and the offset to read
//! from) or for its end through [`Shared::rereads`]; this side starts a
//! client assigned to that partition at that offset, and hands what it
//! reads to the applier's queue as [`Feed::Again`], while the queue holds
//! less than half its bound (where a paused partition resumes: the
//! partition's own reading is never kept paused by a rereading; nothing is
//! kept here). Every rereading has
//! a client of its own, so that nothing read by an earlier one can be
//! taken for the new one's. The client joins no group and commits nothing:
//! it has the worker's `group.id` only because librdkafka assigns
//! partitions to a consumer with one (the same id needs no other right on
//! the broker than the worker's).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::{debug, warn};

use super::applier::{rereading_bytes, Feed, Partition, Record, Refused};
use super::{consumer_config, Shared};

/// Messages handed over from one rereading per turn of the consumer loop
/// that read nothing forward (a turn that did takes one: the partitions'
/// own reading, where the other tenants' messages are, goes first, and a
/// rereading has at least half the turns).
const PER_IDLE_TURN: usize = 256;

/// The rereadings in progress, one client each.
pub(super) struct Rereaders {
    config: ClientConfig,
    topic: String,
    /// Partition → (the rereading's number, its client).
    active: HashMap<i32, (u64, BaseConsumer)>,
}

impl Rereaders {
    pub fn new(shared: &Shared) -> Rereaders {
        let cfg = &shared.cfg;
        // A rereading takes at most half a hold: fetched ahead no further
        // (the broker serves the partition's own reading too).
        let kb = (rereading_bytes(cfg.queue_bytes) >> 10).clamp(1, cfg.fetch_buffer_kb);
        let config = consumer_config(&cfg.kafka, &cfg.group, kb, &[]);
        Rereaders { config, topic: cfg.kafka.topic.clone(), active: HashMap::new() }
    }

    /// One turn of the consumer loop, which `read_forward` a message or
    /// not: starts and ends the rereadings the appliers asked for, and
    /// hands over what is read while the partition's queue is below half.
    pub fn turn(&mut self, shared: &Shared, parts: &Mutex<HashMap<i32, Partition>>, read_forward: bool) {
        let asked: Vec<(i32, Option<(u64, i64)>)> = shared.rereads.lock().expect("rereads lock").drain().collect();
        let mut parts = parts.lock().expect("parts lock");
        for (p, ask) in asked {
            if let Some((_, client)) = self.active.remove(&p) {
                close(client);
            }
            let Some((reread, from)) = ask.filter(|_| parts.contains_key(&p)) else { continue };
            match self.start(p, from) {
                Ok(client) => {
                    debug!(partition = p, reread, offset = from, "rereading started");
                    self.active.insert(p, (reread, client));
                }
                Err(e) => {
                    // Asked again at the next turn.
                    warn!(partition = p, error = %e, "starting a rereading of spilled messages failed");
                    shared.rereads.lock().expect("rereads lock").entry(p).or_insert(Some((reread, from)));
                }
            }
        }
        // Revoked meanwhile.
        let gone: Vec<i32> = self.active.keys().filter(|p| !parts.contains_key(p)).copied().collect();
        for p in gone {
            if let Some((_, client)) = self.active.remove(&p) {
                close(client);
            }
        }
        for (p, (reread, client)) in &self.active {
            let Some(part) = parts.get_mut(p) else { continue };
            for _ in 0..if read_forward { 1 } else { PER_IDLE_TURN } {
                // At most half the queue, where a paused partition resumes:
                // the partition's own reading is never kept paused by it.
                if !part.pending.is_empty() || !part.queue.below_half() {
                    break;
                }
                match client.poll(Duration::ZERO) {
                    Some(Ok(m)) => {
                        if let Err(Refused::Full(feed) | Refused::Ended(feed)) = part.queue.offer(Feed::Again(*reread, Record::of(&m))) {
                            part.pending.push_back(feed);
                        }
                    }
                    Some(Err(e)) => {
                        debug!(partition = p, error = %e, "rereading");
                        break;
                    }
                    None => break,
                }
            }
        }
    }

    fn start(&self, partition: i32, from: i64) -> Result<BaseConsumer, rdkafka::error::KafkaError> {
        let client: BaseConsumer = self.config.create()?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.topic, partition, Offset::Offset(from))?;
        client.assign(&tpl)?;
        Ok(client)
    }
}

impl Drop for Rereaders {
    fn drop(&mut self) {
        for (_, (_, client)) in self.active.drain() {
            close(client);
        }
    }
}

/// Drops a rereading's client off the consumer thread: its close waits
/// for the broker.
fn close(client: BaseConsumer) {
    let spawned = std::thread::Builder::new().name("denorm-reread-close".into()).spawn(move || drop(client));
    if let Err(e) = spawned {
        debug!(error = %e, "closing a rereading's client on a thread of its own failed");
    }
}
