//! `denorm topics` on the real broker: what a deployment's pre-install hook
//! runs before any worker starts.

mod common;

use common::*;
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
