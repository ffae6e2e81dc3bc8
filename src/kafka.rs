//! Kafka plumbing shared by the producer, the worker and the operator
//! commands: client configuration, topic creation, reading a topic whole;
//! a consumer group's lag and the waits on it are [`lag`]'s.

mod lag;

pub use lag::{group_client, group_lag, is_damaged, lag_of, wait_for_deliveries, wait_until_applied, watermarks, LagReport, PartitionLag, WaitError};

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};

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

/// A topic's messages, partition by partition, each with its offset.
pub type TopicLog<T> = Vec<Vec<(i64, T)>>;

/// Every message of the topic from its start to its end as of now,
/// decoded, partition by partition in log order (the demo's and the tests'
/// model checks). Blocking.
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
