//! `denorm topics` on the real broker (what a deployment's pre-install hook
//! runs before any worker starts), the Kafka options file, and where
//! `produce --wait` may stand.

use crate::common::*;
use denorm::kafka::KafkaConfig;

#[test]
fn topics_creates_the_topic_and_its_dead_letter_topic_once() {
    let b = broker();
    let cfg = KafkaConfig { partitions: 3, ..KafkaConfig::new(b.brokers.clone(), unique("denorm-topics")) };
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = output(cli(&cfg, "g", dir.path()).arg("topics"));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("{} partitions=3", cfg.topic)), "{out}");
    let dlq = KafkaConfig { topic: format!("{}.dlq", cfg.topic), ..cfg.clone() };
    assert_eq!(cfg.topic_partitions().unwrap(), Some(3));
    assert_eq!(dlq.topic_partitions().unwrap(), Some(3));

    // Again, asking for another count: the topic is kept as it is, with a warning.
    let more = KafkaConfig { partitions: 5, ..cfg.clone() };
    let (code, out, err) = output(cli(&more, "g", dir.path()).arg("topics"));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("partitions=3"), "{out}");
    assert!(err.contains("already exists with another partition count"), "{err}");
    assert_eq!(cfg.topic_partitions().unwrap(), Some(3));
}

#[test]
fn topics_takes_a_dead_letter_topic_name() {
    let b = broker();
    let cfg = KafkaConfig { partitions: 2, ..KafkaConfig::new(b.brokers.clone(), unique("denorm-topics")) };
    let dlq = KafkaConfig { topic: unique("denorm-dead"), ..cfg.clone() };
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = output(cli(&cfg, "g", dir.path()).args(["topics", "--dlq-topic", &dlq.topic]));
    assert_eq!(code, 0, "{err}");
    assert_eq!(dlq.topic_partitions().unwrap(), Some(2));
}

#[test]
fn kafka_options_come_from_a_file_and_its_values_are_never_printed() {
    let b = broker();
    let cfg = KafkaConfig { partitions: 1, ..KafkaConfig::new(b.brokers.clone(), unique("denorm-topics")) };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kafka.properties");

    // Applied: librdkafka refuses an unknown property read from the file.
    std::fs::write(&file, "# from a Secret\nclient.id=denorm-from-file\n\nno.such.property=x\n").unwrap();
    let (code, _, err) = output(cli(&cfg, "g", dir.path()).arg("--kafka-options-file").arg(&file).arg("topics"));
    assert_ne!(code, 0, "an unknown property in the file was not applied");
    assert!(err.contains("no.such.property"), "{err}");

    // Secrets pass through, and neither output shows them.
    std::fs::write(&file, "client.id=denorm-from-file\r\nsasl.password=hunter2-in-a-file\n").unwrap();
    let (code, out, err) = output(cli(&cfg, "g", dir.path()).env("DENORM_LOG", "debug").arg("--kafka-options-file").arg(&file).arg("topics"));
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("hunter2") && !err.contains("hunter2"), "{out}\n{err}");

    // A malformed line: a usage error naming the line, not its content.
    std::fs::write(&file, "client.id=x\nsasl.password hunter2-in-a-file\n").unwrap();
    let (code, _, err) = output(cli(&cfg, "g", dir.path()).arg("--kafka-options-file").arg(&file).arg("topics"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line 2: expected KEY=VALUE"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn produce_wait_stands_before_the_command_with_seconds_or_after_its_flags() {
    let b = broker();
    let cfg = KafkaConfig { partitions: 1, ..KafkaConfig::new(b.brokers.clone(), unique("denorm-wait")) };
    let dir = tempfile::tempdir().unwrap();
    // No worker runs: each form is parsed, sends its command, then waits and times out.
    for args in [vec!["produce", "--wait", "1", "rename", "--from", "/a/b", "--to", "/a/c"], vec!["produce", "rename", "--from", "/a/b", "--to", "/a/c", "--wait", "1"]] {
        let (code, out, err) = output(cli(&cfg, "g", dir.path()).args(&args));
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(out.contains("\"key\":\"/a\""), "{args:?}: {out}");
        assert!(err.contains("timed out with partition 0 applied up to offset -1 (waiting for"), "{args:?}: {err}");
    }
}

/// Creates `cfg.topic` with the topic settings `settings`.
fn create_with(cfg: &KafkaConfig, settings: &[(&str, &str)]) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    rt().block_on(async {
        let admin: AdminClient<DefaultClientContext> = cfg.client_config().create().unwrap();
        let mut topic = NewTopic::new(&cfg.topic, cfg.partitions, TopicReplication::Fixed(1));
        for (k, v) in settings {
            topic = topic.set(k, v);
        }
        for r in admin.create_topics([&topic], &AdminOptions::new()).await.unwrap() {
            r.unwrap();
        }
    });
    eventually(std::time::Duration::from_secs(30), || format!("topic {} not shown", cfg.topic), || cfg.topic_partitions().unwrap().map(|_| ()));
}

/// Issue 29, 9: topics were created with the broker's default retention
/// (7 days on Kafka), after which rebuilds refuse for ever and dead letters
/// expire. They are created to keep everything now; a compacted topic is
/// refused, and one that does not keep everything is warned about.
#[test]
fn topics_keep_everything_a_compacted_topic_is_refused_and_a_finite_one_warned_about() {
    let b = broker();
    let cfg = KafkaConfig { partitions: 1, ..KafkaConfig::new(b.brokers.clone(), unique("denorm-life")) };
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = output(cli(&cfg, "g", dir.path()).arg("topics"));
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("does not keep its messages for ever"), "{err}");
    for topic in [cfg.topic.clone(), format!("{}.dlq", cfg.topic)] {
        let l = rt().block_on(KafkaConfig { topic: topic.clone(), ..cfg.clone() }.lifetime()).unwrap().expect("tansu describes a topic's settings");
        assert_eq!((l.compacted, l.retention_ms, l.retention_bytes), (false, Some(-1), Some(-1)), "{topic}");
    }
    let compacted = KafkaConfig { topic: unique("denorm-compacted"), ..cfg.clone() };
    create_with(&compacted, &[("cleanup.policy", "compact")]);
    let (code, _, err) = output(cli(&compacted, "g", dir.path()).args(["run", "--metrics-addr", "127.0.0.1:0"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is compacted") && err.contains("cleanup.policy=delete"), "{err}");
    let finite = KafkaConfig { topic: unique("denorm-finite"), ..cfg.clone() };
    create_with(&finite, &[("retention.ms", "604800000")]);
    let (code, _, err) = output(cli(&finite, "g", dir.path()).arg("topics"));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("does not keep its messages for ever") && err.contains("retention.ms=604800000 (about 7 days)"), "{err}");
}
