//! The worker's settings: one typed configuration, its defaults (shared
//! with `denorm run`'s flags), and its validation.

use std::sync::Arc;
use std::time::Duration;

use super::replay::Mode;
use super::WorkerError;
use crate::apply::FanOut;
use crate::kafka::KafkaConfig;

/// Worker settings. Defaults in [`WorkerConfig::new`].
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub kafka: KafkaConfig,
    /// Consumer group id.
    pub group: String,
    /// Most commands applied between two index commits.
    pub max_batch: usize,
    /// Longest time an applied command waits for its index commit: commits
    /// are batched, because each one creates a segment.
    pub commit_linger: Duration,
    /// A batch is committed as soon as no command arrives for this long
    /// (default 5 ms), so that light traffic is searchable at once.
    pub commit_quiet: Duration,
    /// Paging and throttling of fan-outs (default: pages of 1000, no pause).
    pub fan_out: FanOut,
    /// Key lanes per partition (default 8): up to this many keys' fan-outs
    /// run at once, a page at a time, with the other keys' commands applied
    /// between their pages; a key's own commands wait behind its fan-out.
    /// 1: one command at a time in log order.
    pub lanes: usize,
    /// Whether a flooding tenant's messages are held in memory, read ahead
    /// past so that the other tenants' are applied first (default on;
    /// `applier/hold.rs`, docs/tenants.md). Off: log order only.
    pub tenant_read_ahead: bool,
    /// While a tenant's messages are held back, a batch holding another
    /// tenant's command is committed at most this long after the command
    /// joined it, not `commit_linger`: the flood's commands keep the batch
    /// from ever being quiet, and the others' would wait for its linger
    /// and its commit (`triggers.rs`). `None` (the default): the
    /// backend's, [`WorkerConfig::tenant_commit_on`].
    pub tenant_commit: Option<Duration>,
    /// Where a flooding tenant's messages past the hold are kept, in an
    /// unnamed file per partition (default: the system's temporary
    /// directory; `applier/spill.rs`).
    pub spill_dir: std::path::PathBuf,
    /// Bytes kept there per partition at most (default 256 MiB): past
    /// them the partition waits for the spilled messages to be applied.
    pub spill_bytes: u64,
    /// Fan-outs in key lanes in the whole process (default 32), beyond each
    /// partition's first (see `LaneFanOuts`; review of Elasticsearch, F11).
    pub max_lane_fan_outs: usize,
    /// Bytes of messages queued per partition for its applier (default
    /// 16 MiB). A partition whose queue is full is paused, and resumed once
    /// the queue is down to half: pausing makes the client drop what it
    /// prefetched for the partition and fetch it again, so each pause must
    /// buy half a queue of progress.
    pub queue_bytes: usize,
    /// librdkafka's prefetch for the whole consumer, in KiB
    /// (`queued.max.messages.kbytes`; default 16 MiB, librdkafka's own
    /// default is 64 MiB). With `queue_bytes` per assigned partition it
    /// bounds the memory held for messages not yet applied.
    pub fetch_buffer_kb: usize,
    /// Least time between two offset commits to Kafka (default 20 ms):
    /// durable progress is committed as soon as this allows, so that
    /// read-your-writes (`produce --wait`, a cross-key rename's
    /// acknowledgement) sees it at once; nothing is committed without
    /// progress. It was 1 s, which made up nearly all of `produce --wait`'s
    /// second.
    pub commit_interval: Duration,
    /// Longest wait between retries of a transient failure (default 30 s).
    pub retry_backoff_max: Duration,
    /// How often lag gauges are refreshed (default 5 s).
    pub lag_interval: Duration,
    /// Largest payload accepted; larger messages are rejected (default 1 MiB,
    /// Kafka's default `message.max.bytes`).
    pub max_message_bytes: usize,
    /// Longest wait for appliers to finish their command when partitions
    /// are revoked or the worker stops (default 30 s).
    pub shutdown_timeout: Duration,
    /// Longest time from a stop to the process's exit (default 50 s, below
    /// the chart's termination grace of 60 s): draining (at most
    /// `shutdown_timeout`), committing, leaving the group. What cannot be
    /// committed by then (a broker gone) is given up: the next owner
    /// replays it from the shard's checkpoint, harmlessly.
    pub shutdown_grace: Duration,
    /// Where aborted and parked commands go (default `<topic>.dlq`).
    pub dlq_topic: String,
    /// What happens to a key's later commands after one is aborted.
    pub on_abort: OnAbort,
    /// Attempts at a command the index rejects before it is aborted
    /// (default 3). Transient failures are retried without limit.
    pub max_attempts: u32,
    /// Resolves schema-registry framed messages (none: only single-object
    /// encoding is accepted).
    pub registry: Option<Arc<crate::codec::registry::Registry>>,
    /// A declared model whose commands are decoded and applied beside the
    /// compiled-in ones.
    pub model: Option<&'static crate::domain::Domain>,
    /// Static group membership (`group.instance.id`): a worker restarted
    /// with the same id within the session timeout gets its partitions
    /// back without a rebalance.
    pub instance_id: Option<String>,
    /// How long the group waits for a silent member (`session.timeout.ms`,
    /// default 45 s).
    pub session_timeout: Duration,
    /// Whether a take-over waits until the partition its documents leave is
    /// applied up to their departure (default true; see
    /// `--no-takeover-waits`).
    pub takeover_waits: bool,
    /// The longest a message waits on another partition or on the rest of
    /// a move (default 10 minutes): an owner change's upsert or a move's
    /// first chunk waiting for the partition its documents leave, and a
    /// move spanning several messages waiting for its next chunk. Past it
    /// the message is dead-lettered with a reason of its own
    /// (`takeover_timeout`, `move_incomplete`) and its key parked; the
    /// partition goes on. Live, a take-over's limit counts from the start
    /// of its wait; in a replay, from the last progress of the partition
    /// it waits for, which runs at its own pace.
    pub wait_limit: Duration,
    /// How long a partition's fetch position may stay below the broker's
    /// end with nothing waiting for its applier before it is reported
    /// stalled (default 60 s; `fetch_stall.rs`).
    pub fetch_stall_after: Duration,
    /// Keys a partition parks at most (default 10,000): parked keys are
    /// kept in every checkpoint. An abort past it dead-letters its command
    /// without parking its key (`denorm_parking_refused_total`).
    pub max_parked_keys: usize,
    /// What the worker feeds: the live index (default), or a replay of
    /// the log for `denorm rebuild` or `denorm verify`.
    pub mode: Mode,
    /// Accept messages in any partition (a topic written with another
    /// partitioner than murmur2), refusing renames across top-level
    /// directories; otherwise (the default) a message whose key does not
    /// hash to its partition is dead-lettered (`--any-partitioner`).
    pub any_partitioner: bool,
}

/// What happens to a key's later commands once one is aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnAbort {
    /// See [`OnAbort::summary`] (also `--on-abort`'s help).
    Park,
    /// See [`OnAbort::summary`].
    Skip,
}

impl OnAbort {
    pub const ALL: [OnAbort; 2] = [OnAbort::Park, OnAbort::Skip];

    /// The policy's name on the command line, in the chart and in the
    /// recorded settings.
    pub fn name(self) -> &'static str {
        match self {
            OnAbort::Park => "park",
            OnAbort::Skip => "skip",
        }
    }

    /// One line on what the policy does (`--help`).
    pub fn summary(self) -> &'static str {
        match self {
            OnAbort::Park => "Dead-letter them too (reason `parked`) until an operator acts: the key's order is never broken",
            OnAbort::Skip => "Apply them anyway: availability over order",
        }
    }
}

impl std::str::FromStr for OnAbort {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        OnAbort::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| format!("unknown abort policy {s:?} (expected park or skip)"))
    }
}

/// The defaults of the worker's settings, once: [`WorkerConfig::new`] and
/// `denorm run`'s flags both take them from here.
pub mod defaults {
    pub const MAX_BATCH: usize = 20_000;
    pub const LANES: usize = 8;
    pub const MAX_LANE_FAN_OUTS: usize = 32;
    pub const COMMIT_LINGER_MS: u64 = 100;
    pub const COMMIT_QUIET_MS: u64 = 5;
    pub const TENANT_COMMIT_MS: u64 = 20;
    pub const QUEUE_KB: u64 = 16 << 10;
    pub const SPILL_MB: u64 = 256;
    pub const FETCH_BUFFER_KB: u64 = 16 << 10;
    pub const COMMIT_INTERVAL_MS: u64 = 20;
    pub const RETRY_BACKOFF_MAX_MS: u64 = 30_000;
    pub const SHUTDOWN_TIMEOUT_SECS: u64 = 30;
    pub const SHUTDOWN_GRACE_SECS: u64 = 50;
    pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
    pub const MAX_ATTEMPTS: u32 = 3;
    pub const SESSION_TIMEOUT_MS: u32 = 45_000;
    pub const WAIT_LIMIT_SECS: u64 = 600;
    pub const MAX_PARKED_KEYS: usize = 10_000;
    pub const FETCH_STALL_SECS: u64 = 60;
}

impl WorkerConfig {
    /// The time of [`WorkerConfig::tenant_commit`] on a backend whose
    /// commits are shared or not ([`crate::index::Backend::commits_are_shared`]):
    /// the one set, else 20 ms where commits are local (the embedded
    /// index), and `commit_linger` where they are shared, which turns it
    /// off (on noida-db's Elasticsearch API it measured slower:
    /// docs/benchmark.md).
    pub fn tenant_commit_on(&self, shared_commits: bool) -> Duration {
        self.tenant_commit.unwrap_or(match shared_commits {
            true => self.commit_linger,
            false => Duration::from_millis(defaults::TENANT_COMMIT_MS),
        })
    }

    pub fn new(kafka: KafkaConfig, group: impl Into<String>) -> Self {
        WorkerConfig {
            group: group.into(),
            max_batch: defaults::MAX_BATCH,
            commit_linger: Duration::from_millis(defaults::COMMIT_LINGER_MS),
            commit_quiet: Duration::from_millis(defaults::COMMIT_QUIET_MS),
            fan_out: FanOut::pages_of(crate::apply::DEFAULT_PAGE_SIZE),
            lanes: defaults::LANES,
            tenant_read_ahead: true,
            tenant_commit: None,
            spill_dir: std::env::temp_dir(),
            spill_bytes: defaults::SPILL_MB << 20,
            max_lane_fan_outs: defaults::MAX_LANE_FAN_OUTS,
            queue_bytes: (defaults::QUEUE_KB << 10) as usize,
            fetch_buffer_kb: defaults::FETCH_BUFFER_KB as usize,
            commit_interval: Duration::from_millis(defaults::COMMIT_INTERVAL_MS),
            retry_backoff_max: Duration::from_millis(defaults::RETRY_BACKOFF_MAX_MS),
            lag_interval: Duration::from_secs(5),
            shutdown_timeout: Duration::from_secs(defaults::SHUTDOWN_TIMEOUT_SECS),
            shutdown_grace: Duration::from_secs(defaults::SHUTDOWN_GRACE_SECS),
            max_message_bytes: defaults::MAX_MESSAGE_BYTES,
            dlq_topic: crate::dlq::default_topic(&kafka.topic),
            on_abort: OnAbort::Park,
            max_attempts: defaults::MAX_ATTEMPTS,
            registry: None,
            model: None,
            instance_id: None,
            session_timeout: Duration::from_millis(defaults::SESSION_TIMEOUT_MS as u64),
            takeover_waits: true,
            wait_limit: Duration::from_secs(defaults::WAIT_LIMIT_SECS),
            max_parked_keys: defaults::MAX_PARKED_KEYS,
            fetch_stall_after: Duration::from_secs(defaults::FETCH_STALL_SECS),
            mode: Mode::Live,
            any_partitioner: false,
            kafka,
        }
    }
}

impl WorkerConfig {
    /// Every setting checked at once: the first one out of range, named
    /// with its flag. [`run`] refuses a configuration that fails this.
    pub fn validate(&self) -> Result<(), WorkerError> {
        let bad = |flag: &str, why: String| Err(WorkerError::Config(format!("{flag}: {why}")));
        let at_least = |flag: &str, v: u128, min: u128| if v < min { bad(flag, format!("{v} is below the least allowed, {min}")) } else { Ok(()) };
        at_least("--max-batch", self.max_batch as u128, 1)?;
        at_least("--queue-kb (bytes)", self.queue_bytes as u128, 1)?;
        at_least("--fetch-buffer-kb", self.fetch_buffer_kb as u128, 1)?;
        at_least("--commit-interval-ms", self.commit_interval.as_millis(), 10)?;
        at_least("--max-attempts", self.max_attempts as u128, 1)?;
        at_least("--max-message-bytes", self.max_message_bytes as u128, 1)?;
        at_least("--page-size", self.fan_out.page_size as u128, 1)?;
        at_least("--lanes", self.lanes as u128, 1)?;
        at_least("--max-lane-fan-outs", self.max_lane_fan_outs as u128, 1)?;
        at_least("--retry-backoff-max-ms", self.retry_backoff_max.as_millis(), 50)?;
        at_least("--wait-limit-secs (ms)", self.wait_limit.as_millis(), 100)?;
        at_least("--max-parked-keys", self.max_parked_keys as u128, 1)?;
        at_least("--fetch-stall-secs (ms)", self.fetch_stall_after.as_millis(), 1000)?;
        // Kafka's defaults for group.min/max.session.timeout.ms.
        let session = self.session_timeout.as_millis();
        if !(6_000..=1_800_000).contains(&session) {
            return bad("--session-timeout-ms", format!("{session} is outside what brokers accept by default (6000..=1800000)"));
        }
        if self.shutdown_grace < self.shutdown_timeout {
            return bad(
                "--shutdown-grace-secs",
                format!("{} s is below --shutdown-timeout-secs ({} s): the grace bounds the whole stop, draining included", self.shutdown_grace.as_secs(), self.shutdown_timeout.as_secs()),
            );
        }
        if self.group.trim().is_empty() {
            return bad("--group", "empty".into());
        }
        if self.dlq_topic.trim().is_empty() || self.dlq_topic == self.kafka.topic {
            return bad("--dlq-topic", format!("{:?} cannot hold dead letters of topic {:?}", self.dlq_topic, self.kafka.topic));
        }
        if self.instance_id.as_deref().is_some_and(|id| id.trim().is_empty()) {
            return bad("--instance-id", "empty".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> WorkerConfig {
        WorkerConfig::new(KafkaConfig::new("127.0.0.1:9092", "t"), "g")
    }

    #[test]
    fn the_defaults_are_valid() {
        cfg().validate().unwrap();
    }

    #[test]
    fn the_tenant_commit_is_20_ms_on_the_embedded_index_and_off_on_elasticsearch_unless_set() {
        use crate::index::Backend;
        let dir = tempfile::tempdir().unwrap();
        let embedded = crate::index::embedded::EmbeddedBackend::new(crate::index::embedded::EmbeddedIndex::open(dir.path(), "t").unwrap(), 20 << 20);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let elastic = crate::index::elastic::backend::ElasticBackend::new(elasticsearch::Elasticsearch::default(), "p", "t", rt.handle().clone());
        let mut c = cfg();
        c.commit_linger = Duration::from_millis(150);
        assert_eq!(c.tenant_commit_on(embedded.commits_are_shared()), Duration::from_millis(20));
        assert_eq!(c.tenant_commit_on(elastic.commits_are_shared()), Duration::from_millis(150), "the linger: no sooner than without it");
        c.tenant_commit = Some(Duration::from_millis(5));
        assert_eq!(c.tenant_commit_on(embedded.commits_are_shared()), Duration::from_millis(5));
        assert_eq!(c.tenant_commit_on(elastic.commits_are_shared()), Duration::from_millis(5));
    }

    #[test]
    fn an_abort_policy_reads_back_from_its_name_and_its_serde_form() {
        for p in OnAbort::ALL {
            assert_eq!(p.name().parse::<OnAbort>(), Ok(p));
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{}\"", p.name()));
        }
        assert!("Park".parse::<OnAbort>().unwrap_err().contains("park or skip"));
    }

    #[test]
    fn each_setting_out_of_range_is_refused_naming_its_flag() {
        type Spoil = Box<dyn Fn(&mut WorkerConfig)>;
        let cases: Vec<(&str, Spoil)> = vec![
            ("--max-batch", Box::new(|c| c.max_batch = 0)),
            ("--queue-kb", Box::new(|c| c.queue_bytes = 0)),
            ("--commit-interval-ms", Box::new(|c| c.commit_interval = Duration::from_millis(1))),
            ("--max-attempts", Box::new(|c| c.max_attempts = 0)),
            ("--page-size", Box::new(|c| c.fan_out.page_size = 0)),
            ("--lanes", Box::new(|c| c.lanes = 0)),
            ("--max-lane-fan-outs", Box::new(|c| c.max_lane_fan_outs = 0)),
            ("--session-timeout-ms", Box::new(|c| c.session_timeout = Duration::from_millis(500))),
            ("--session-timeout-ms", Box::new(|c| c.session_timeout = Duration::from_secs(7200))),
            ("--shutdown-grace-secs", Box::new(|c| c.shutdown_grace = Duration::from_secs(5))),
            ("--dlq-topic", Box::new(|c| c.dlq_topic = "t".into())),
            ("--group", Box::new(|c| c.group = " ".into())),
            ("--instance-id", Box::new(|c| c.instance_id = Some(String::new()))),
            ("--wait-limit-secs", Box::new(|c| c.wait_limit = Duration::ZERO)),
            ("--max-parked-keys", Box::new(|c| c.max_parked_keys = 0)),
            ("--fetch-stall-secs", Box::new(|c| c.fetch_stall_after = Duration::ZERO)),
        ];
        for (flag, spoil) in cases {
            let mut c = cfg();
            spoil(&mut c);
            let e = c.validate().expect_err(flag).to_string();
            assert!(e.contains(flag), "{flag}: {e}");
        }
    }
}
