//! What the worker asks the broker outside the group protocol: a
//! partition's watermarks, the group's committed offsets and its lag.
//! Asked on the appliers' and the group watch's threads, never on the
//! consumer thread: a request to a slow or absent broker there would stop
//! the poll loop (and with it every partition, heartbeats of the
//! rebalance protocol included).

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tracing::warn;

use crate::kafka::KafkaConfig;

/// Longest wait for one answer: an applier positioning its partition waits
/// this at most before it goes on without the watermarks.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) trait LogProbe: Send + Sync {
    /// The partition's low and high watermarks; `None` when they could not
    /// be read (logged).
    fn watermarks(&self, partition: i32) -> Option<(i64, i64)>;
    /// The group's committed offset of the partition; `None` when it has
    /// none or it could not be read.
    fn committed(&self, partition: i32) -> Option<i64>;
    /// Messages of the topic the group has not committed, over every
    /// partition; `None` when it could not be read.
    fn group_lag(&self) -> Option<i64>;
}

/// A [`LogProbe`] on a client of its own: it carries the group's id (to
/// read its offsets) but never joins the group.
pub(crate) struct BrokerProbe {
    client: BaseConsumer,
    topic: String,
    partitions: i32,
}

impl BrokerProbe {
    pub(crate) fn new(kafka: &KafkaConfig, group: &str, partitions: i32) -> Result<Self, crate::kafka::KafkaSetupError> {
        Ok(BrokerProbe { client: crate::kafka::group_client(kafka, group)?, topic: kafka.topic.clone(), partitions })
    }

    /// Finds the group's coordinator ahead of the appliers' first question
    /// (a client's first request to it takes about a second).
    pub(crate) fn warm_up(self: &std::sync::Arc<Self>) {
        let me = self.clone();
        let _ = std::thread::Builder::new().name("denorm-probe-warm-up".into()).spawn(move || {
            let _ = me.committed(0);
        });
    }
}

impl LogProbe for BrokerProbe {
    fn watermarks(&self, partition: i32) -> Option<(i64, i64)> {
        match self.client.fetch_watermarks(&self.topic, partition, ASK_TIMEOUT) {
            Ok(w) => Some(w),
            Err(e) => {
                warn!(partition, error = %e, "reading the partition's watermarks failed");
                None
            }
        }
    }

    fn committed(&self, partition: i32) -> Option<i64> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topic, partition);
        match self.client.committed_offsets(tpl, ASK_TIMEOUT) {
            Ok(c) => match c.find_partition(&self.topic, partition)?.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            },
            Err(e) => {
                warn!(partition, error = %e, "reading the group's committed offset failed");
                None
            }
        }
    }

    fn group_lag(&self) -> Option<i64> {
        match crate::kafka::lag_of(&self.client, &self.topic, self.partitions, ASK_TIMEOUT) {
            Ok(r) => Some(r.total),
            Err(e) => {
                warn!(error = %e, "reading the group's lag failed");
                None
            }
        }
    }
}

impl<T: LogProbe + ?Sized> LogProbe for std::sync::Arc<T> {
    fn watermarks(&self, partition: i32) -> Option<(i64, i64)> {
        (**self).watermarks(partition)
    }

    fn committed(&self, partition: i32) -> Option<i64> {
        (**self).committed(partition)
    }

    fn group_lag(&self) -> Option<i64> {
        (**self).group_lag()
    }
}
