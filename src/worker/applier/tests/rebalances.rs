//! The consumer thread's rebalance callback (`worker/rebalance.rs`) on the
//! rig's appliers: a consumer that reaches no broker, called as librdkafka
//! calls it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, TopicPartitionList};

use super::*;
use crate::worker::membership::Membership;
use crate::worker::rebalance::WorkerContext;

/// A consumer of `r`'s shared state whose context holds the appliers of
/// `partitions`, as the consumer thread does after an assignment.
fn consumer_holding(r: &Rig, partitions: &[i32]) -> BaseConsumer<WorkerContext> {
    let parts = partitions.iter().map(|&p| (p, Partition::spawn(p, r.shared.clone()))).collect::<HashMap<_, _>>();
    let ctx = WorkerContext {
        shared: r.shared.clone(),
        parts: Mutex::new(parts),
        health: r.shared.health.clone(),
        fatal: Mutex::new(None),
        stopped: Mutex::default(),
        membership: Mutex::new(Membership::joining(Instant::now(), Duration::from_secs(30))),
        commits: Mutex::new(None),
        commit_failures: Mutex::default(),
    };
    ClientConfig::new().set("bootstrap.servers", "127.0.0.1:9").set("group.id", "g").create_with_context(ctx).unwrap()
}

/// A rebalance error is given up as a revoke is: the partition's applier
/// is stopped and removed, its shard let go, so that a later assignment
/// starts an applier that positions the partition (and the partition's new
/// owner can open the shard). Left running, it kept the shard locked and
/// was reused unpositioned by the next assignment.
#[test]
fn a_rebalance_error_drains_the_appliers_as_a_revoke_does() {
    let r = Rig::new(|c| c.shutdown_timeout = Duration::from_secs(10));
    r.produce_files(0..5);
    let consumer = consumer_holding(&r, &[0]);
    // The applier has opened its shard and asked to be positioned.
    eventually("the applier asks its position", || r.shared.seeks.lock().unwrap().contains_key(&0));
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition("t", 0);
    consumer.context().rebalance(&consumer, RDKafkaRespErr::RD_KAFKA_RESP_ERR__FAIL, &mut tpl);
    let left: Vec<i32> = consumer.context().parts.lock().unwrap().keys().copied().collect();
    assert!(left.is_empty(), "appliers left running after the rebalance error: {left:?}");
    assert!(r.shared.seeks.lock().unwrap().is_empty(), "a seek of a given-up partition left behind");
    assert!(consumer.context().fatal.lock().unwrap().is_none(), "the drain failed: {:?}", consumer.context().fatal.lock().unwrap());
    // The shard is free: a new applier opens it and applies the log.
    let run = r.start();
    let end = r.end();
    run.wait_next(end);
    assert_eq!(run.stop(), end);
    assert_eq!(r.files().len(), 5);
}

/// A seek asked by an applier that no longer holds the partition (one
/// left behind by a drain, the partition assigned back meanwhile) is
/// dropped, never served to the partition's new applier; the new
/// applier's own seek waits until the partition can be sought.
#[test]
fn a_seek_asked_by_an_applier_that_no_longer_holds_the_partition_is_dropped() {
    let r = Rig::new(|_| {});
    let consumer = consumer_holding(&r, &[0]);
    eventually("the applier asks its position", || r.shared.seeks.lock().unwrap().contains_key(&0));
    let holder = consumer.context().parts.lock().unwrap()[&0].id;
    let own = r.shared.seeks.lock().unwrap()[&0];
    assert_eq!(own.0, holder);
    // Not assigned here: the holder's seek cannot be served yet, and stays.
    crate::worker::seek_as_asked(&consumer, "t");
    assert_eq!(r.shared.seeks.lock().unwrap().get(&0), Some(&own), "the holder's seek was dropped");
    r.shared.seeks.lock().unwrap().insert(0, (holder + 1000, rdkafka::Offset::Offset(5)));
    crate::worker::seek_as_asked(&consumer, "t");
    assert_eq!(r.shared.seeks.lock().unwrap().get(&0), None, "another applier's seek was kept for the holder");
}
