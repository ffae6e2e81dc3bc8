//! `denorm topics`: create the command topic and its dead-letter topic when
//! they are missing (what `run` does at start), for a deployment's
//! pre-install step.

use anyhow::Context;
use clap::Args;
use tracing::warn;

use super::Cli;
use denorm::kafka::KafkaConfig;

#[derive(Debug, Args)]
pub struct TopicsArgs {
    /// Dead-letter topic [default: <topic>.dlq]
    #[arg(long, env = "DENORM_DLQ_TOPIC")]
    dlq_topic: Option<String>,
}

/// The command topic (created with `kafka.partitions` when missing) and the
/// dead-letter topic (created with as many partitions), both kept for ever;
/// a compacted one is refused, one that does not keep everything warned
/// about. Returns the command topic's partition count and the dead-letter
/// topic's configuration.
pub async fn ensure(kafka: &KafkaConfig, dlq_topic: Option<&str>) -> anyhow::Result<(i32, KafkaConfig)> {
    let partitions = kafka.ensure_topic().await.with_context(|| format!("cannot reach or create the topic {}", kafka.topic))?;
    let topic = dlq_topic.map(str::to_string).unwrap_or_else(|| denorm::dlq::default_topic(&kafka.topic));
    let dlq = KafkaConfig { topic, partitions, ..kafka.clone() };
    dlq.ensure_topic().await.with_context(|| format!("cannot reach or create the dead-letter topic {}", dlq.topic))?;
    check_lifetime(kafka, "command topic").await?;
    check_lifetime(&dlq, "dead-letter topic").await?;
    Ok((partitions, dlq))
}

/// [`KafkaConfig::check_lifetime`], a compacted topic as a usage error.
pub async fn check_lifetime(kafka: &KafkaConfig, what: &str) -> anyhow::Result<()> {
    match kafka.check_lifetime(what).await {
        Ok(_) => Ok(()),
        Err(e @ denorm::kafka::KafkaSetupError::Compacted(_)) => Err(super::UsageError(e.to_string()).into()),
        Err(e) => Err(anyhow::Error::new(e).context(format!("reading the settings of the {what} {}", kafka.topic))),
    }
}

pub async fn run(cli: &Cli, a: &TopicsArgs) -> anyhow::Result<()> {
    let kafka = cli.kafka();
    let (partitions, dlq) = ensure(&kafka, a.dlq_topic.as_deref()).await?;
    if partitions != kafka.partitions {
        warn!(topic = %kafka.topic, partitions, asked = kafka.partitions, "the topic already exists with another partition count; `denorm migrate` changes it");
    }
    println!("{} partitions={partitions}", kafka.topic);
    println!("{} (dead letters)", dlq.topic);
    Ok(())
}
