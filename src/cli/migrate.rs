//! `denorm migrate`: copies the command topic into a new topic with another
//! partition count, keeping every key's order, so that an index can be
//! rebuilt from it (`denorm --topic NEW rebuild`).
//!
//! Per-key order holds because every command of a key is in one source
//! partition, which is read in order, and goes to one target partition
//! (Java's murmur2 partitioner, as `denorm produce` uses) through an
//! idempotent producer, which keeps the order per partition.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use tracing::info;

use super::{Cli, UsageError};
use crate::kafka::{watermarks, KafkaConfig};

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Topic to copy the commands into (created; it must not hold messages yet)
    #[arg(long, env = "DENORM_MIGRATE_TO_TOPIC")]
    to_topic: String,
    /// Partitions of the new topic
    #[arg(long, env = "DENORM_MIGRATE_TO_PARTITIONS", value_parser = clap::value_parser!(i32).range(1..=10000))]
    to_partitions: i32,
}

pub async fn run(cli: &Cli, a: &MigrateArgs) -> anyhow::Result<()> {
    let from = cli.kafka();
    if a.to_topic == from.topic {
        return Err(UsageError("--to-topic must differ from --topic".into()).into());
    }
    let partitions = from.topic_partitions()?.ok_or_else(|| UsageError(format!("topic {} does not exist", from.topic)))?;
    let to = KafkaConfig { topic: a.to_topic.clone(), partitions: a.to_partitions, ..from.clone() };
    let have = to.ensure_topic().await.with_context(|| format!("creating the topic {}", to.topic))?;
    if have != a.to_partitions {
        bail!("topic {} exists with {have} partitions, not {}", to.topic, a.to_partitions);
    }
    tokio::task::spawn_blocking(move || copy(&from, partitions, &to)).await?
}

fn copy(from: &KafkaConfig, partitions: i32, to: &KafkaConfig) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut cc = from.client_config();
    cc.set("group.id", format!("denorm-migrate-{}", uuid::Uuid::new_v4().simple()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false");
    let consumer: BaseConsumer = cc.create()?;
    let ends = |c: &BaseConsumer, cfg: &KafkaConfig, n: i32| watermarks(c, &cfg.topic, n).with_context(|| format!("reading the offsets of {}", cfg.topic));
    let target = ends(&consumer, to, to.partitions)?;
    if target.iter().any(|(_, high)| *high > 0) {
        bail!("topic {} already holds messages: migrate copies into an empty topic only", to.topic);
    }
    let mut marks = ends(&consumer, from, partitions)?;
    if let Some((p, (low, _))) = marks.iter().enumerate().find(|(_, (low, _))| *low > 0) {
        bail!(
            "partition {p} of {} starts at offset {low}: retention has deleted commands, and a copy would hide that the \
             history is incomplete (a rebuild from it could not be exact)",
            from.topic
        );
    }
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(&from.topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let producer: ThreadedProducer<DefaultProducerContext> = to
        .producer_config(&[("partitioner", "murmur2_random"), ("linger.ms", "5"), ("compression.type", "lz4"), ("message.timeout.ms", "300000")])
        .create()?;
    let total: i64 = marks.iter().map(|(_, h)| h).sum();
    let bar = super::progress(total.max(0) as u64, "migrate");
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut next: HashMap<i32, i64> = (0..partitions).map(|p| (p, 0)).collect();
    let mut copied: u64 = 0;
    let mut skipped: u64 = 0;
    let mut cleared_after: u64 = 0;
    let codec = crate::codec::Codec::new();
    loop {
        // Done with the log as of the last look: look again, so that
        // commands written meanwhile are copied too.
        if next.iter().all(|(p, n)| *n >= marks[*p as usize].1) {
            producer.flush(Duration::from_secs(300))?;
            let now = ends(&consumer, from, partitions)?;
            if now == marks {
                break;
            }
            marks = now;
            bar.set_length(marks.iter().map(|(_, h)| *h).sum::<i64>().max(0) as u64);
        }
        let Some(m) = consumer.poll(Duration::from_millis(100)) else { continue };
        let m = m.context("reading the source topic")?;
        if m.payload().is_some_and(|p| codec.is_move(p)) {
            // A cross-key move's documents name a place in the old topic's
            // logs; the new topic's workers write their own when they apply
            // the rename.
            next.insert(m.partition(), m.offset() + 1);
            skipped += 1;
            bar.inc(1);
            continue;
        }
        // An owner change's `after` names a place in the old topic's logs
        // too: left out (its upsert is then applied without waiting).
        let cleared = m.payload().and_then(|p| without_after(&codec, p));
        if cleared.is_some() {
            cleared_after += 1;
        }
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&to.topic);
        if let Some(k) = m.key() {
            record = record.key(k);
        }
        if let Some(v) = cleared.as_deref().or(m.payload()) {
            record = record.payload(v);
        }
        if let Some(ts) = m.timestamp().to_millis() {
            record = record.timestamp(ts);
        }
        let mut record = record;
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((e, r)) if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) => {
                    producer.poll(Duration::from_millis(50));
                    record = r;
                }
                Err((e, _)) => return Err(e).context("writing to the new topic"),
            }
        }
        next.insert(m.partition(), m.offset() + 1);
        copied += 1;
        bar.inc(1);
    }
    producer.flush(Duration::from_secs(300))?;
    let written: i64 = ends(&consumer, to, to.partitions)?.iter().map(|(_, h)| h).sum();
    bar.finish_and_clear();
    if written != copied as i64 {
        bail!("copied {copied} commands but {} holds {written}", to.topic);
    }
    info!(copied, skipped, cleared_after, secs = started.elapsed().as_secs_f64(), "topic copied");
    println!(
        "copied {copied} commands from {} ({partitions} partitions) to {} ({} partitions) in {:.1}s, per-key order kept \
         ({skipped} messages of cross-key moves left out: the new topic's workers write their own). \
         Next: point the producers at {}, run `denorm --topic {} rebuild`, then restart the workers with --topic {}",
        from.topic,
        to.topic,
        to.partitions,
        started.elapsed().as_secs_f64(),
        to.topic,
        to.topic,
        to.topic
    );
    Ok(())
}

/// `payload` re-encoded without its envelope's `after`, when it is a
/// command (single-object encoded) that has one.
fn without_after(codec: &crate::codec::Codec, payload: &[u8]) -> Option<Vec<u8>> {
    let mut e = codec.decode(payload).ok()?;
    e.after.take()?;
    Some(codec.encode(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, Envelope, LogPosition};

    #[test]
    fn an_owner_changes_after_is_left_out_and_everything_else_kept() {
        let codec = crate::codec::Codec::new();
        let upsert = Command::UpsertPost { id: "p".into(), user_id: "u2".into(), title: "t".into(), body: "b".into(), previous_user_id: Some("u1".into()) };
        let mut e = Envelope::new(upsert);
        e.tenant = Some("acme".into());
        e.after = Some(LogPosition { partition: 3, offset: 17 });
        let copied = without_after(&codec, &codec.encode(&e)).expect("re-encoded");
        let got = codec.decode(&copied).unwrap();
        assert_eq!(got.after, None);
        assert_eq!(Envelope { after: e.after, ..got }, e);
        // Without one, the message is copied as it is.
        e.after = None;
        assert_eq!(without_after(&codec, &codec.encode(&e)), None);
        assert_eq!(without_after(&codec, b"not avro"), None);
    }
}
