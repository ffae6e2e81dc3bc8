//! Offset commits whose answers come back. rust-rdkafka's `BaseConsumer`
//! enables librdkafka's commit events but sets no `offset_commit_cb`, and
//! librdkafka answers an asynchronous `rd_kafka_commit` only to one: its
//! `commit_callback` never runs for them. Here each commit names a queue of
//! its own (`rd_kafka_commit_queue`), which the consumer thread drains
//! without waiting: a commit counts once the broker confirmed it, and a stop
//! can wait for the last one with a deadline.

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::TopicPartitionList;

/// One partition's part of an answer: its offset, and whether the broker
/// took it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answered {
    pub partition: i32,
    pub offset: i64,
    pub error: Option<String>,
}

/// The queue the answers to this worker's commits arrive on.
pub(crate) struct CommitQueue {
    queue: *mut rd::rd_kafka_queue_t,
    in_flight: usize,
}

// SAFETY: a librdkafka queue may be used from any thread; the pointer is
// owned by this value (destroyed in Drop) and only used through &mut self
// or &self calls that librdkafka makes thread-safe.
unsafe impl Send for CommitQueue {}

impl CommitQueue {
    pub(crate) fn new<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> Self {
        // SAFETY: the client handle is valid while `consumer` lives, and the
        // queue only references it (it is destroyed before the client: the
        // worker drops it first).
        let queue = unsafe { rd::rd_kafka_queue_new(consumer.client().native_ptr()) };
        CommitQueue { queue, in_flight: 0 }
    }

    /// Sends a commit of `tpl`; its answer is read by [`CommitQueue::answers`].
    pub(crate) fn send<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, tpl: &TopicPartitionList) -> KafkaResult<()> {
        // SAFETY: valid client, list and queue; librdkafka copies the list.
        let err = unsafe { rd::rd_kafka_commit_queue(consumer.client().native_ptr(), tpl.ptr(), self.queue, None, std::ptr::null_mut()) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(KafkaError::ConsumerCommit(err.into()));
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Commits sent and not answered yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The answers arrived so far, without waiting: per partition, or one
    /// request-level error.
    pub(crate) fn answers(&mut self) -> Vec<Result<Vec<Answered>, String>> {
        let mut out = Vec::new();
        loop {
            // SAFETY: valid queue; a returned event is destroyed below.
            let ev = unsafe { rd::rd_kafka_queue_poll(self.queue, 0) };
            if ev.is_null() {
                return out;
            }
            // SAFETY: `ev` is a valid event until destroyed; the list it
            // returns is owned by the event and read before that.
            unsafe {
                if rd::rd_kafka_event_type(ev) == rd::RD_KAFKA_EVENT_OFFSET_COMMIT {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    let err = rd::rd_kafka_event_error(ev);
                    if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                        out.push(Err(rdkafka::error::RDKafkaErrorCode::from(err).to_string()));
                    } else {
                        out.push(Ok(partitions(rd::rd_kafka_event_topic_partition_list(ev))));
                    }
                }
                rd::rd_kafka_event_destroy(ev);
            }
        }
    }
}

/// Failed offset commits in a row. While a rebalance is in progress every
/// commit fails (`RebalanceInProgress`) until the member has rejoined: at
/// the default interval that is 50 failures a second. The first of a run is
/// worth a warning; the rest are counted, and the count is told when a
/// commit succeeds again.
#[derive(Debug, Default)]
pub(crate) struct FailureRun {
    failed: u64,
}

impl FailureRun {
    /// Counts a failure; true for the first of a run (the one to tell).
    pub(crate) fn failed(&mut self) -> bool {
        self.failed += 1;
        self.failed == 1
    }

    /// Ends a run: how many commits had failed in it, if any.
    pub(crate) fn succeeded(&mut self) -> Option<u64> {
        (self.failed > 0).then(|| std::mem::take(&mut self.failed))
    }
}

/// The entries of a librdkafka partition list.
///
/// # Safety
/// `list` is null or a valid list for the duration of the call.
unsafe fn partitions(list: *const rd::rd_kafka_topic_partition_list_t) -> Vec<Answered> {
    if list.is_null() {
        return Vec::new();
    }
    let list = &*list;
    (0..list.cnt as usize)
        .map(|i| {
            let e = &*list.elems.add(i);
            let error = (e.err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR).then(|| rdkafka::error::RDKafkaErrorCode::from(e.err).to_string());
            Answered { partition: e.partition, offset: e.offset, error }
        })
        .collect()
}

impl Drop for CommitQueue {
    fn drop(&mut self) {
        // SAFETY: the queue was created by rd_kafka_queue_new and is
        // destroyed once.
        unsafe { rd::rd_kafka_queue_destroy(self.queue) }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    use super::FailureRun;
    use crate::command::Command;
    use crate::http::Health;
    use crate::index::embedded::{EmbeddedBackend, EmbeddedIndex};
    use crate::kafka::KafkaConfig;
    use crate::worker::{self, Stats, WorkerConfig};

    /// The log lines of every thread, kept for the test to read.
    #[derive(Clone, Default)]
    struct Log(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Log {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// On librdkafka's in-process broker, told to refuse the next three
    /// offset commits: the worker counts each refusal
    /// (`denorm_consumer_offset_commit_failures_total`, which
    /// `DenormOffsetCommitsFailing` alerts on), sends the offset again at
    /// each interval, and it is committed once the broker takes it. Both
    /// backends share this path (it is the Kafka side of the worker).
    #[test]
    fn refused_offset_commits_are_counted_and_sent_again_until_one_is_taken() {
        let log = Log::default();
        let writer = log.clone();
        tracing::subscriber::set_global_default(tracing_subscriber::fmt().with_ansi(false).with_max_level(tracing::Level::INFO).with_writer(move || writer.clone()).finish()).unwrap();
        let metrics = crate::metrics::install().unwrap();
        let cluster = MockCluster::new(1).unwrap();
        let topic = "commits";
        cluster.create_topic(topic, 1, 1).unwrap();
        cluster.create_topic(&crate::dlq::default_topic(topic), 1, 1).unwrap();
        let mut kafka = KafkaConfig::new(cluster.bootstrap_servers(), topic);
        kafka.partitions = 1;
        let rt = tokio::runtime::Runtime::new().unwrap();
        let file = Command::UpsertFile { id: "f".into(), path: "/a/f.txt".into(), contents: "x".into(), previous_path: None };
        rt.block_on(async { crate::produce::Producer::new(&kafka).unwrap().send_all(vec![file], 10, |_| {}).await.unwrap() });
        cluster.request_errors(RDKafkaApiKey::OffsetCommit, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE; 3]);

        let dir = tempfile::tempdir().unwrap();
        let backend = Arc::new(EmbeddedBackend::new(EmbeddedIndex::open(dir.path(), topic).unwrap(), 64 << 20));
        let cfg = WorkerConfig::new(kafka.clone(), "commits");
        worker::settings::announce(backend.as_ref(), &cfg).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let w = {
            let stop = stop.clone();
            std::thread::spawn(move || worker::run(cfg, backend, stop, Arc::new(Health::default()), Arc::new(Stats::default())))
        };
        let applied = crate::kafka::wait_until_applied(&kafka, "commits", 1, Duration::from_secs(60), |_| {});
        stop.store(true, Ordering::SeqCst);
        w.join().unwrap().unwrap();
        applied.expect("the group's offset committed once the broker took it");
        let text = metrics.render();
        let refused = text.lines().find_map(|l| l.strip_prefix("denorm_consumer_offset_commit_failures_total ")).unwrap_or_else(|| panic!("no refusal counted:\n{text}"));
        assert_eq!(refused.trim(), "3", "{text}");
        // One warning for the run, and its count once a commit is taken.
        let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        assert_eq!(log.matches("offset commit failed").count(), 1, "{log}");
        assert!(log.contains("offset commits succeed again failed_in_a_row=3"), "{log}");
    }

    #[test]
    fn the_first_failure_of_a_run_is_told_and_the_run_is_counted_when_a_commit_succeeds() {
        let mut run = FailureRun::default();
        assert_eq!(run.succeeded(), None, "no run yet");
        assert_eq!([run.failed(), run.failed(), run.failed()], [true, false, false]);
        assert_eq!(run.succeeded(), Some(3));
        assert_eq!(run.succeeded(), None, "the run ended");
        assert!(run.failed(), "a new run is told again");
    }
}
