//! Kafka plumbing shared by the producer, the worker and the operator
//! commands: client configuration, topic creation, consumer-group lag.

use crate::index::progress::DoneAbove;
use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

/// Default timeout of metadata, offset and admin requests.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the commands live.
#[derive(Clone)]
pub struct KafkaConfig {
    /// Bootstrap servers, `host:port[,host:port]`.
    pub brokers: String,
    pub topic: String,
    /// Partitions of the topic when denorm creates it.
    pub partitions: i32,
    /// Replication factor of the topic when denorm creates it.
    pub replication: i32,
    /// Raw librdkafka options passed through (`key=value`).
    pub options: Vec<(String, String)>,
    /// Keys that sign and verify denorm's own messages on the topic
    /// ([`crate::signing`]); none: they are accepted from any writer.
    pub signing: Option<std::sync::Arc<crate::signing::Signing>>,
}

/// librdkafka's errors logged as rust-rdkafka logs them, but for the end of
/// a partition (`enable.partition.eof`), which arrives as a global error and
/// is no error for a client that asks for it.
pub fn log_client_error(error: &KafkaError, reason: &str) {
    if error.rdkafka_error_code() != Some(RDKafkaErrorCode::PartitionEOF) {
        tracing::error!("librdkafka: {}: {}", error, reason);
    }
}

/// The client context of a consumer that reads partitions to their end:
/// [`log_client_error`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadsToEnd;

impl rdkafka::ClientContext for ReadsToEnd {
    fn error(&self, error: KafkaError, reason: &str) {
        log_client_error(&error, reason);
    }
}

impl rdkafka::consumer::ConsumerContext for ReadsToEnd {}

/// `e`, once `consumer` has served what it queued: librdkafka's logs and
/// errors travel on the client's queue, and they say why a request failed
/// (a certificate refused, an authentication failed), where the error
/// says only "broker transport failure". A one-shot client that never
/// polls would exit without them.
pub fn told<C: rdkafka::consumer::ConsumerContext>(consumer: &BaseConsumer<C>, e: KafkaError) -> KafkaError {
    let deadline = std::time::Instant::now() + Duration::from_millis(200);
    while std::time::Instant::now() < deadline {
        if consumer.poll(Duration::from_millis(20)).is_none() {
            break;
        }
    }
    e
}

/// Whether a librdkafka option holds a secret (passwords, keys, tokens).
pub fn is_secret_option(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ["password", "secret", "key.pem", "private", "token", "sasl.jaas", "credentials"].iter().any(|s| k.contains(s))
}

/// Options with secret values redacted, for messages and logs.
pub fn redacted(options: &[(String, String)]) -> Vec<(String, String)> {
    options.iter().map(|(k, v)| (k.clone(), if is_secret_option(k) { "<redacted>".into() } else { v.clone() })).collect()
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("partitions", &self.partitions)
            .field("replication", &self.replication)
            .field("options", &redacted(&self.options))
            .field("signing", &self.signing)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KafkaSetupError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// A compacted topic: compaction deletes commands a replay needs.
    #[error(
        "topic {0} is compacted (cleanup.policy includes compact): compaction deletes older commands of a key, which a \
         rebuild needs, and leaves offsets without messages. denorm needs the whole log: use cleanup.policy=delete with \
         retention.ms=-1 (`kafka-configs --alter --entity-type topics --entity-name {0} --add-config cleanup.policy=delete,retention.ms=-1`)"
    )]
    Compacted(String),
    #[error("creating topic {topic}: {code}")]
    CreateTopic { topic: String, code: RDKafkaErrorCode },
    #[error("topic {0} does not exist")]
    MissingTopic(String),
}

impl KafkaConfig {
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>) -> Self {
        KafkaConfig { brokers: brokers.into(), topic: topic.into(), partitions: 12, replication: 1, options: Vec::new(), signing: None }
    }

    /// Base client configuration: bootstrap servers plus the pass-through options.
    pub fn client_config(&self) -> ClientConfig {
        self.config_with(&[])
    }

    /// The configuration of every client that reads messages: [`KafkaConfig::client_config`]
    /// with `check.crcs=true`, so that librdkafka checks each record batch's
    /// CRC-32C and reports a damaged batch as an error (`BadMessage`)
    /// instead of delivering its bytes. A pass-through `-X check.crcs=false`
    /// still wins.
    pub fn consumer_config(&self) -> ClientConfig {
        self.config_with(&[("check.crcs", "true")])
    }

    fn config_with(&self, settings: &[(&str, &str)]) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        for (k, v) in settings {
            c.set(*k, *v);
        }
        for (k, v) in &self.options {
            c.set(k, v);
        }
        self.poll_interval_follows_session(&mut c);
        c
    }

    /// librdkafka refuses a `max.poll.interval.ms` (default 300000) shorter
    /// than `session.timeout.ms`: raises it to the session timeout set in
    /// `c`, unless the pass-through options set it explicitly.
    pub fn poll_interval_follows_session(&self, c: &mut ClientConfig) {
        if self.options.iter().any(|(k, _)| k == "max.poll.interval.ms") {
            return;
        }
        if let Some(session) = c.get("session.timeout.ms").and_then(|v| v.parse::<u64>().ok()) {
            c.set("max.poll.interval.ms", session.max(300_000).to_string());
        }
    }

    /// An idempotent producer's configuration (`acks=all`) with `extra`
    /// settings; the pass-through options come last, so they win.
    pub fn producer_config(&self, extra: &[(&str, &str)]) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers).set("enable.idempotence", "true").set("acks", "all");
        for (k, v) in extra {
            c.set(*k, *v);
        }
        for (k, v) in &self.options {
            c.set(k, v);
        }
        c
    }

    /// Number of partitions of the topic, `None` when it does not exist.
    pub fn topic_partitions(&self) -> Result<Option<i32>, KafkaSetupError> {
        let consumer: BaseConsumer = self.consumer_config().create()?;
        let md = consumer.fetch_metadata(Some(&self.topic), REQUEST_TIMEOUT).map_err(|e| told(&consumer, e))?;
        Ok(md.topics().iter().find(|t| t.name() == self.topic && t.error().is_none() && !t.partitions().is_empty()).map(|t| t.partitions().len() as i32))
    }

    /// Creates the topic with `partitions` when it is missing. Returns its
    /// partition count.
    pub async fn ensure_topic(&self) -> Result<i32, KafkaSetupError> {
        let this = self.clone();
        if let Some(n) = tokio::task::spawn_blocking(move || this.topic_partitions()).await.expect("join")? {
            return Ok(n);
        }
        let admin: AdminClient<DefaultClientContext> = self.client_config().create()?;
        // Kept for ever: a rebuild replays the whole log, and dead letters
        // wait for an operator (brokers delete after 7 days by default).
        let topic = NewTopic::new(&self.topic, self.partitions, TopicReplication::Fixed(self.replication)).set("retention.ms", "-1").set("retention.bytes", "-1");
        let opts = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
        for result in admin.create_topics([&topic], &opts).await? {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => return Err(KafkaSetupError::CreateTopic { topic, code }),
            }
        }
        // Wait until the metadata shows it.
        for _ in 0..100 {
            let this = self.clone();
            if let Some(n) = tokio::task::spawn_blocking(move || this.topic_partitions()).await.expect("join")? {
                return Ok(n);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(KafkaSetupError::MissingTopic(self.topic.clone()))
    }
}

/// What a topic's settings say about how long it keeps its messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lifetime {
    pub compacted: bool,
    /// `retention.ms` and `retention.bytes` (-1: unlimited).
    pub retention_ms: Option<i64>,
    pub retention_bytes: Option<i64>,
}

impl Lifetime {
    /// From a topic's settings (`cleanup.policy`, `retention.ms`,
    /// `retention.bytes`).
    pub fn of<'a>(settings: impl IntoIterator<Item = (&'a str, &'a str)>) -> Lifetime {
        let mut l = Lifetime::default();
        for (name, value) in settings {
            match name {
                "cleanup.policy" => l.compacted = value.split(',').any(|p| p.trim() == "compact"),
                "retention.ms" => l.retention_ms = value.parse().ok(),
                "retention.bytes" => l.retention_bytes = value.parse().ok(),
                _ => {}
            }
        }
        l
    }

    /// What the topic keeps, when it does not keep everything.
    pub fn finite(&self) -> Option<String> {
        let ms = self.retention_ms.filter(|ms| *ms >= 0).map(|ms| format!("retention.ms={ms} (about {} days)", ms / 86_400_000));
        let bytes = self.retention_bytes.filter(|b| *b >= 0).map(|b| format!("retention.bytes={b} per partition"));
        let both: Vec<String> = ms.into_iter().chain(bytes).collect();
        (!both.is_empty()).then(|| both.join(" and "))
    }
}

impl KafkaConfig {
    /// The topic's [`Lifetime`], `None` when the broker does not say.
    pub async fn lifetime(&self) -> Result<Option<Lifetime>, KafkaSetupError> {
        use rdkafka::admin::ResourceSpecifier;
        let admin: AdminClient<DefaultClientContext> = self.client_config().create()?;
        let opts = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
        let described = match admin.describe_configs([&ResourceSpecifier::Topic(&self.topic)], &opts).await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(topic = %self.topic, error = %e, "the broker does not describe the topic's settings");
                return Ok(None);
            }
        };
        Ok(described.into_iter().next().and_then(Result::ok).map(|r| Lifetime::of(r.entries.iter().filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?))))))
    }

    /// Refuses a compacted topic; warns when the topic does not keep its
    /// messages for ever (`what` names it for people: the command topic,
    /// the dead-letter topic).
    pub async fn check_lifetime(&self, what: &str) -> Result<Option<Lifetime>, KafkaSetupError> {
        let lifetime = self.lifetime().await?;
        if let Some(l) = &lifetime {
            if l.compacted {
                return Err(KafkaSetupError::Compacted(self.topic.clone()));
            }
            if let Some(kept) = l.finite() {
                tracing::warn!(topic = %self.topic, kept, "the {what} does not keep its messages for ever: once the broker deletes some, `denorm rebuild` and `denorm migrate` cannot replay it whole (`rebuild --accept-gaps` rebuilds from what is left) and dead letters expire. Set retention.ms=-1 and retention.bytes=-1");
            }
        }
        Ok(lifetime)
    }
}

/// Lag of one partition for a consumer group.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PartitionLag {
    pub partition: i32,
    /// Committed offset (next message to apply); 0 when nothing is committed.
    pub committed: i64,
    /// End offset (high watermark).
    pub end: i64,
    pub lag: i64,
    /// Commands not applied: `lag` less what the commit's metadata records
    /// applied above the committed offset (issue 45; equal to `lag` where
    /// the broker keeps no metadata, tansu 0.6).
    pub unapplied: i64,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LagReport {
    pub total: i64,
    /// Commands not applied, summed ([`PartitionLag::unapplied`]).
    pub unapplied: i64,
    pub partitions: Vec<PartitionLag>,
}

/// The low and high watermarks of partitions `0..partitions` of `topic`, in
/// partition order. Blocking.
pub fn watermarks<C: rdkafka::consumer::ConsumerContext>(consumer: &BaseConsumer<C>, topic: &str, partitions: i32) -> Result<Vec<(i64, i64)>, KafkaSetupError> {
    (0..partitions).map(|p| Ok(consumer.fetch_watermarks(topic, p, REQUEST_TIMEOUT)?)).collect()
}

/// Committed offset, end offset and lag of every partition of the topic for
/// `group`. Blocking.
pub fn group_lag(cfg: &KafkaConfig, group: &str) -> Result<LagReport, KafkaSetupError> {
    let consumer = group_client(cfg, group)?;
    let partitions = cfg.topic_partitions()?.ok_or_else(|| KafkaSetupError::MissingTopic(cfg.topic.clone()))?;
    lag_of(&consumer, &cfg.topic, partitions, REQUEST_TIMEOUT)
}

/// Whether a consumer error reports a damaged record batch: a CRC
/// mismatch (`check.crcs`, see [`KafkaConfig::consumer_config`]) or bytes
/// librdkafka cannot parse. librdkafka skips such a batch and reads on, so
/// a reader that goes on reads the partition with a hole in it.
pub fn is_damaged(e: &KafkaError) -> bool {
    matches!(e, KafkaError::MessageConsumption(c) | KafkaError::MessageConsumptionFatal(c) if *c == RDKafkaErrorCode::BadMessage)
}

/// A client that carries `group`'s id, to read its offsets, and never joins
/// the group.
pub fn group_client(cfg: &KafkaConfig, group: &str) -> Result<BaseConsumer, KafkaSetupError> {
    let mut c = cfg.consumer_config();
    c.set("group.id", group).set("enable.auto.commit", "false");
    Ok(c.create()?)
}

/// The lag of partitions `0..partitions` of `topic` for the group of
/// `consumer` (see [`group_client`]), each request waiting at most
/// `timeout`. Blocking.
pub fn lag_of<C: rdkafka::consumer::ConsumerContext>(consumer: &BaseConsumer<C>, topic: &str, partitions: i32, timeout: Duration) -> Result<LagReport, KafkaSetupError> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = consumer.committed_offsets(tpl, timeout).map_err(|e| told(consumer, e))?;
    let mut out = Vec::new();
    for p in 0..partitions {
        let (low, end) = consumer.fetch_watermarks(topic, p, timeout).map_err(|e| told(consumer, e))?;
        let entry = committed.find_partition(topic, p);
        let (committed, done) = match entry.as_ref().map(|e| e.offset()) {
            Some(Offset::Offset(o)) => (o, entry.map(|e| DoneAbove::from_metadata(e.metadata(), o)).unwrap_or_default()),
            _ => (low.max(0), DoneAbove::default()),
        };
        let lag = (end - committed).max(0);
        out.push(PartitionLag { partition: p, committed, end, lag, unapplied: (lag - done.applied_in(committed, end)).max(0) });
    }
    Ok(LagReport { total: out.iter().map(|p| p.lag).sum(), unapplied: out.iter().map(|p| p.unapplied).sum(), partitions: out })
}

/// Polls the group's lag until every partition's committed offset reaches
/// its end offset and at least `min_end` messages exist in the topic, or
/// `timeout` passes. `progress` sees each report. Blocking.
pub fn wait_until_applied(cfg: &KafkaConfig, group: &str, min_end: i64, timeout: Duration, mut progress: impl FnMut(&LagReport)) -> Result<LagReport, WaitError> {
    wait_on_lag(cfg, group, timeout, Duration::from_millis(50), |r| {
        progress(r);
        let end: i64 = r.partitions.iter().map(|p| p.end).sum();
        r.total == 0 && end >= min_end
    })
}

/// Read-your-writes: waits until `group` has applied every one of
/// `deliveries` (its committed offset of each partition passes the
/// delivered offset). Blocking.
///
/// One client, made once, asks the group's coordinator for the committed
/// offsets of the partitions concerned every 10 ms (one request; no
/// watermarks, no metadata): it used to make a client and read the lag of
/// every partition each 100 ms, which cost more than the wait itself.
pub fn wait_for_deliveries(cfg: &KafkaConfig, group: &str, deliveries: &[crate::command::LogPosition], timeout: Duration) -> Result<(), WaitError> {
    use crate::retry::{poll_until, Polled};
    let need = awaited(deliveries);
    if need.is_empty() {
        return Ok(());
    }
    let consumer = group_client(cfg, group).map_err(WaitError::Kafka)?;
    let mut tpl = TopicPartitionList::new();
    for p in need.keys() {
        tpl.add_partition(&cfg.topic, *p);
    }
    let mut error = None;
    let deadline = std::time::Instant::now() + timeout;
    let mut answered = false;
    let polled = poll_until(timeout, Duration::from_millis(10), || {
        // The first read may take the whole request timeout (a group's
        // coordinator answers its first request in about a second): the
        // wait then ends with where the group stands, not a bare timeout.
        // Later reads stop at the deadline.
        let left = match answered {
            false => REQUEST_TIMEOUT,
            true => REQUEST_TIMEOUT.min(deadline.saturating_duration_since(std::time::Instant::now())),
        };
        match consumer.committed_offsets(tpl.clone(), left) {
            Ok(committed) => {
                answered = true;
                let at: BTreeMap<i32, Committed> = need
                    .keys()
                    .map(|p| {
                        let e = committed.find_partition(&cfg.topic, *p);
                        let next = match e.as_ref().map(|e| e.offset()) {
                            Some(Offset::Offset(o)) => o,
                            _ => 0,
                        };
                        let done = e.map(|e| DoneAbove::from_metadata(e.metadata(), next)).unwrap_or_default();
                        (*p, Committed { next, done })
                    })
                    .collect();
                match lagging(&need, &at).is_empty() {
                    true => Polled::Done(()),
                    false => Polled::NotYet(at),
                }
            }
            Err(e) => {
                error = Some(KafkaSetupError::from(e));
                Polled::Unknown
            }
        }
    });
    match polled {
        Ok(()) => Ok(()),
        Err(Some(at)) => Err(WaitError::Behind(lagging(&need, &at))),
        Err(None) => Err(error.map_or(WaitError::Timeout(None), WaitError::Kafka)),
    }
}

/// Per partition, `deliveries`' offsets.
fn awaited(deliveries: &[crate::command::LogPosition]) -> BTreeMap<i32, Vec<i64>> {
    let mut need: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for d in deliveries {
        need.entry(d.partition).or_default().push(d.offset);
    }
    need
}

/// Where a group stands in a partition: its committed offset, and what its
/// commit's metadata records as applied above it (issue 45; nothing where
/// the broker does not keep the metadata, tansu 0.6).
#[derive(Debug, Clone, Default)]
struct Committed {
    next: i64,
    done: DoneAbove,
}

impl Committed {
    /// Whether the command at `offset` is applied: below the committed
    /// offset, or recorded applied above it.
    fn applied(&self, offset: i64) -> bool {
        offset < self.next || (self.next > 0 && self.done.contains(Some(self.next as u64 - 1), offset))
    }
}

/// The partitions with an awaited offset not applied, judged command by
/// command (`at`: where the group stands; committed 0 when absent): each
/// with its committed offset and the highest offset awaited and not
/// applied.
fn lagging(need: &BTreeMap<i32, Vec<i64>>, at: &BTreeMap<i32, Committed>) -> Vec<(i32, i64, i64)> {
    need.iter()
        .filter_map(|(p, offsets)| {
            let c = at.get(p).cloned().unwrap_or_default();
            offsets.iter().filter(|o| !c.applied(**o)).max().map(|o| (*p, c.next, *o))
        })
        .collect()
}

/// Reads the group's lag every `every` until `done` says so or `timeout`
/// passes: the timeout carries the last report, or the last error when no
/// report was ever read.
fn wait_on_lag(cfg: &KafkaConfig, group: &str, timeout: Duration, every: Duration, mut done: impl FnMut(&LagReport) -> bool) -> Result<LagReport, WaitError> {
    use crate::retry::{poll_until, Polled};
    // One client and one look at the partitions for the whole wait (a new
    // client each time cost more than the requests).
    let consumer = group_client(cfg, group).map_err(WaitError::Kafka)?;
    let partitions = cfg.topic_partitions().map_err(WaitError::Kafka)?.ok_or_else(|| WaitError::Kafka(KafkaSetupError::MissingTopic(cfg.topic.clone())))?;
    let mut error = None;
    poll_until(timeout, every, || match lag_of(&consumer, &cfg.topic, partitions, REQUEST_TIMEOUT) {
        Ok(r) if done(&r) => Polled::Done(r),
        Ok(r) => Polled::NotYet(r),
        Err(e) => {
            error = Some(e);
            Polled::Unknown
        }
    })
    .map_err(|last| match (last, error) {
        (None, Some(e)) => WaitError::Kafka(e),
        (last, _) => WaitError::Timeout(last),
    })
}

/// Every message of the topic from its start to its end as of now,
/// decoded, partition by partition in log order (the demo's and the tests'
/// model checks). Blocking.
/// A topic's messages, partition by partition, each with its offset.
pub type TopicLog<T> = Vec<Vec<(i64, T)>>;

pub fn read_topic(cfg: &KafkaConfig, codec: &crate::codec::Codec) -> Result<TopicLog<crate::codec::Decoded>, String> {
    read_topic_as(cfg, |p, offset, payload| codec.decode_message(payload).map(Some).map_err(|e| format!("partition {p} offset {offset}: {e}")))
}

/// [`read_topic`] with messages that do not decode left out (a poison
/// message, which a worker dead-letters), and how many were.
pub fn read_topic_decodable(cfg: &KafkaConfig, codec: &crate::codec::Codec) -> Result<(TopicLog<crate::codec::Decoded>, usize), String> {
    let mut undecodable = 0;
    let logs = read_topic_as(cfg, |_, _, payload| match codec.decode_message(payload) {
        Ok(d) => Ok(Some(d)),
        Err(_) => {
            undecodable += 1;
            Ok(None)
        }
    })?;
    Ok((logs, undecodable))
}

/// Every message of the topic, partition by partition, through `decode`
/// (partition, offset, payload): `None` leaves the message out.
fn read_topic_as<T>(cfg: &KafkaConfig, mut decode: impl FnMut(i32, i64, &[u8]) -> Result<Option<T>, String>) -> Result<TopicLog<T>, String> {
    use rdkafka::message::Message;
    let partitions = cfg.topic_partitions().map_err(|e| e.to_string())?.ok_or_else(|| format!("no topic {}", cfg.topic))?;
    let mut c = cfg.consumer_config();
    c.set("group.id", "denorm-reader").set("enable.auto.commit", "false");
    let consumer: BaseConsumer = c.create().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for p in 0..partitions {
        let (low, high) = consumer.fetch_watermarks(&cfg.topic, p, REQUEST_TIMEOUT).map_err(|e| e.to_string())?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&cfg.topic, p, Offset::Offset(low)).map_err(|e| e.to_string())?;
        consumer.assign(&tpl).map_err(|e| e.to_string())?;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let (mut msgs, mut next) = (Vec::new(), low);
        while next < high {
            if std::time::Instant::now() >= deadline {
                return Err(format!("reading partition {p} of {} timed out at offset {next} of {high}", cfg.topic));
            }
            if let Some(m) = consumer.poll(Duration::from_millis(200)) {
                let m = m.map_err(|e| e.to_string())?;
                next = m.offset() + 1;
                if let Some(decoded) = decode(p, m.offset(), m.payload().unwrap_or_default())? {
                    msgs.push((m.offset(), decoded));
                }
            }
        }
        out.push(msgs);
    }
    Ok(out)
}

#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("timed out waiting for the group to apply everything ({})", pending(.0))]
    Timeout(Option<LagReport>),
    /// Timed out: the partitions still behind what was awaited, each with
    /// the group's committed offset and the offset awaited there.
    #[error("timed out with {}; is a worker of the group running? `denorm lag` shows more", behind(.0))]
    Behind(Vec<(i32, i64, i64)>),
    #[error(transparent)]
    Kafka(KafkaSetupError),
}

fn behind(parts: &[(i32, i64, i64)]) -> String {
    let each: Vec<String> = parts.iter().map(|(p, committed, at)| format!("partition {p} applied up to offset {} (waiting for {at})", committed - 1)).collect();
    each.join(", ")
}

/// The partitions still behind in a lag report, for a timeout's message.
fn pending(report: &Option<LagReport>) -> String {
    let Some(r) = report else { return "no lag report could be read".into() };
    let behind: Vec<String> = r.partitions.iter().filter(|p| p.lag > 0).map(|p| format!("partition {}: {} unapplied", p.partition, p.lag)).collect();
    if behind.is_empty() {
        "no partition was behind at the last report".into()
    } else {
        format!("{}; is a worker of the group running? `denorm lag` shows more", behind.join(", "))
    }
}

/// Deletes the rebuild's (or a verify's) consumer group (it committed no
/// offsets; this removes its name too). Best effort: a broker that cannot
/// is said so.
pub fn delete_group(kafka: &KafkaConfig, group: &str, rt: &tokio::runtime::Handle) {
    let deleted = kafka.client_config().create::<AdminClient<DefaultClientContext>>().map_err(|e| e.to_string()).and_then(|admin| {
        let opts = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
        rt.block_on(admin.delete_groups(&[group], &opts)).map_err(|e| e.to_string())?.into_iter().try_for_each(|r| r.map(|_| ()).map_err(|(_, code)| code.to_string()))
    });
    if let Err(error) = deleted {
        tracing::warn!(group, error, "could not delete the replay's consumer group (a rebuild's or a verify's; it holds no offsets)");
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::consumer::BaseConsumer;
    use rdkafka::producer::BaseProducer;

    /// The transports and codecs managed clusters need are compiled into
    /// librdkafka: a client with each of them is created (no broker is
    /// reached; creation is where librdkafka refuses what it lacks).
    #[test]
    fn tls_sasl_and_every_compression_codec_are_compiled_in() {
        let cfg = super::KafkaConfig::new("127.0.0.1:9", "t");
        let features = rdkafka::util::get_rdkafka_version();
        for (protocol, mechanism) in [
            ("ssl", None),
            ("sasl_ssl", Some("PLAIN")),
            ("sasl_ssl", Some("SCRAM-SHA-256")),
            ("sasl_ssl", Some("SCRAM-SHA-512")),
            ("sasl_ssl", Some("OAUTHBEARER")),
            ("sasl_plaintext", Some("SCRAM-SHA-512")),
        ] {
            let mut c = cfg.consumer_config();
            c.set("security.protocol", protocol).set("sasl.username", "u").set("sasl.password", "p");
            if let Some(m) = mechanism {
                c.set("sasl.mechanism", m);
            }
            if mechanism == Some("OAUTHBEARER") {
                c.remove("sasl.username").remove("sasl.password").set("sasl.oauthbearer.config", "principal=denorm");
                c.set("enable.sasl.oauthbearer.unsecure.jwt", "true");
            }
            if let Err(e) = c.create::<BaseConsumer>() {
                panic!("{protocol} with {mechanism:?} refused by librdkafka {features:?}: {e}");
            }
        }
        for codec in ["gzip", "snappy", "lz4", "zstd"] {
            if let Err(e) = cfg.producer_config(&[("compression.type", codec)]).create::<BaseProducer>() {
                panic!("compression.type={codec} refused by librdkafka {features:?}: {e}");
            }
        }
    }

    #[test]
    fn a_wait_timeout_names_the_partitions_behind() {
        let p = |partition, lag| super::PartitionLag { partition, committed: 10, end: 10 + lag, lag, unapplied: lag };
        let r = super::LagReport { total: 3, unapplied: 3, partitions: vec![p(0, 0), p(4, 3)] };
        let msg = super::WaitError::Timeout(Some(r)).to_string();
        assert!(msg.contains("partition 4: 3 unapplied"), "{msg}");
        assert!(!msg.contains("partition 0"), "{msg}");
        assert!(super::WaitError::Timeout(None).to_string().contains("no lag report"));
    }

    #[test]
    fn read_your_writes_waits_for_each_delivery_command_by_command() {
        use super::Committed;
        use crate::command::LogPosition;
        use crate::index::progress::DoneAbove;
        use std::collections::BTreeMap;
        let at = |partition, offset| LogPosition { partition, offset };
        let upto = |c: &[(i32, i64)]| -> BTreeMap<i32, Committed> { c.iter().map(|(p, n)| (*p, Committed { next: *n, done: DoneAbove::default() })).collect() };
        let need = super::awaited(&[at(0, 4), at(2, 9), at(0, 7)]);
        assert_eq!(need.into_iter().collect::<Vec<_>>(), vec![(0, vec![4, 7]), (2, vec![9])]);
        let need = super::awaited(&[at(0, 7), at(2, 9)]);
        // Committed 8 on partition 0 (offset 7 applied); nothing on 2.
        assert_eq!(super::lagging(&need, &upto(&[(0, 8)])), vec![(2, 0, 9)]);
        let committed = upto(&[(0, 7), (2, 10)]);
        assert_eq!(super::lagging(&need, &committed), vec![(0, 7, 7)], "committed 7: offset 7 not applied yet");
        let msg = super::WaitError::Behind(super::lagging(&need, &committed)).to_string();
        assert!(msg.contains("partition 0 applied up to offset 6 (waiting for 7)"), "{msg}");
        assert!(super::lagging(&need, &upto(&[(0, 8), (2, 10)])).is_empty());
        // Issue 45: the group's offset held at 5 by a fan-out (5 and 6
        // unfinished), its commit's metadata recording 7 and 8 applied:
        // a wait for 7 is over, one for 6 is not.
        let held: BTreeMap<i32, Committed> = [(0, Committed { next: 5, done: DoneAbove::from_metadata(&DoneAbove::new(4, 8, [5, 6]).to_metadata(5), 5) })].into_iter().collect();
        assert!(super::lagging(&super::awaited(&[at(0, 7)]), &held).is_empty());
        assert_eq!(super::lagging(&super::awaited(&[at(0, 6), at(0, 8)]), &held), vec![(0, 5, 6)]);
    }

    #[test]
    fn readers_check_crcs_unless_told_not_to_and_a_damaged_batch_is_told_apart() {
        let mut c = super::KafkaConfig::new("b:9092", "t");
        assert_eq!(c.consumer_config().get("check.crcs"), Some("true"));
        assert_eq!(c.client_config().get("check.crcs"), None, "producers and admin clients do not take the consumer property");
        c.options = vec![("check.crcs".into(), "false".into())];
        assert_eq!(c.consumer_config().get("check.crcs"), Some("false"));
        use rdkafka::error::KafkaError;
        use rdkafka::types::RDKafkaErrorCode;
        assert!(super::is_damaged(&KafkaError::MessageConsumption(RDKafkaErrorCode::BadMessage)));
        assert!(super::is_damaged(&KafkaError::MessageConsumptionFatal(RDKafkaErrorCode::BadMessage)));
        assert!(!super::is_damaged(&KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure)));
    }

    #[test]
    fn the_poll_interval_follows_a_long_session_timeout_unless_set() {
        let mut c = super::KafkaConfig::new("b:9092", "t");
        c.options = vec![("session.timeout.ms".into(), "400000".into())];
        assert_eq!(c.client_config().get("max.poll.interval.ms"), Some("400000"));
        c.options = vec![("session.timeout.ms".into(), "10000".into())];
        assert_eq!(c.client_config().get("max.poll.interval.ms"), Some("300000"));
        c.options.push(("max.poll.interval.ms".into(), "500000".into()));
        assert_eq!(c.client_config().get("max.poll.interval.ms"), Some("500000"));
        c.options.clear();
        assert_eq!(c.client_config().get("max.poll.interval.ms"), None);
    }

    #[test]
    fn debug_output_redacts_secret_options() {
        let mut c = super::KafkaConfig::new("b:9092", "t");
        c.options = vec![
            ("sasl.password".into(), "hunter2".into()),
            ("ssl.key.password".into(), "k3y".into()),
            ("sasl.oauthbearer.client.secret".into(), "s3c".into()),
            ("security.protocol".into(), "SASL_SSL".into()),
        ];
        let shown = format!("{c:?}");
        for secret in ["hunter2", "k3y", "s3c"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("SASL_SSL"), "{shown}");
    }
}
