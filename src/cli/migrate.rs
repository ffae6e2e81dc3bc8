//! `denorm migrate`: the arguments and the progress shown; the copy is
//! [`denorm::migrate`].

use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;

use super::{Cli, UsageError};
use denorm::kafka::KafkaConfig;

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Topic to copy the commands into (created; it must not hold messages yet)
    #[arg(long, env = "DENORM_MIGRATE_TO_TOPIC")]
    to_topic: String,
    /// Partitions of the new topic
    #[arg(long, env = "DENORM_MIGRATE_TO_PARTITIONS", value_parser = clap::value_parser!(i32).range(1..=10000))]
    to_partitions: i32,
    /// Dead-letter topic of --topic [default: <topic>.dlq]: control messages
    /// (`dlq reprocess`, `clear`) name positions its letters record, which
    /// the copy rewrites to the new topic's
    #[arg(long, env = "DENORM_DLQ_TOPIC")]
    dlq_topic: Option<String>,
    /// Leave out every message of this tenant (repeatable): its commands, its move chunks
    /// and control messages. For off-boarding or erasure: after `tenant delete`, copy the
    /// topic without the tenant, rebuild from the copy, then delete the old topic and its
    /// dead-letter topic (docs/tenants.md)
    #[arg(long = "drop-tenant", value_name = "TENANT", value_parser = super::parse_tenant)]
    drop_tenants: Vec<String>,
    /// With --signing-key-file: sign the move chunks and control messages that carry no valid
    /// signature in --topic (turning signing on for a history you trust). Without it they are
    /// copied unsigned, and workers dead-letter them as forged
    #[arg(long)]
    sign_unsigned: bool,
}

pub async fn run(cli: &Cli, a: &MigrateArgs) -> anyhow::Result<()> {
    let from = cli.kafka();
    if a.to_topic == from.topic {
        return Err(UsageError("--to-topic must differ from --topic".into()).into());
    }
    let partitions = from.topic_partitions()?.ok_or_else(|| UsageError(format!("topic {} does not exist", from.topic)))?;
    super::topics::check_lifetime(&from, "command topic").await?;
    let to = KafkaConfig { topic: a.to_topic.clone(), partitions: a.to_partitions, ..from.clone() };
    let have = to.ensure_topic().await.with_context(|| format!("creating the topic {}", to.topic))?;
    if have != a.to_partitions {
        bail!("topic {} exists with {have} partitions, not {}", to.topic, a.to_partitions);
    }
    if a.sign_unsigned && from.signing.is_none() {
        return Err(UsageError("--sign-unsigned needs --signing-key-file (the keys to sign with)".into()).into());
    }
    let selection = denorm::migrate::Selection { drop_tenants: a.drop_tenants.iter().cloned().collect(), sign_unsigned: a.sign_unsigned };
    let dlq = a.dlq_topic.clone().unwrap_or_else(|| denorm::dlq::default_topic(&from.topic));
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let (letters, _) = denorm::dlq::admin::read(&from, &dlq).with_context(|| format!("reading the dead-letter topic {dlq}"))?;
        let lettered = denorm::migrate::lettered(&letters);
        let bar = super::progress(0, "migrate");
        if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        let done = denorm::migrate::copy(&from, partitions, &to, &lettered, &selection, |copied, total| {
            bar.set_length(total);
            bar.set_position(copied);
        });
        bar.finish_and_clear();
        let done = done?;
        if done.tenant_messages_dropped > 0 || !selection.drop_tenants.is_empty() {
            let names: Vec<&str> = selection.drop_tenants.iter().map(String::as_str).collect();
            println!("left out {} message(s) of tenant(s) {}: {} and its dead-letter topic still hold them until you delete those topics", done.tenant_messages_dropped, names.join(", "), from.topic);
        }
        if from.signing.is_some() {
            println!("signatures: {} kept, {} signed anew (--sign-unsigned), {} copied unsigned (workers dead-letter these as forged)", done.signed, done.signed_anew, done.unsigned);
        }
        println!(
            "copied {} messages from {} ({partitions} partitions) to {} ({} partitions) in {:.1}s, per-key order kept; \
             {} chunk(s) of cross-key moves, {} owner change(s) and {} operator request(s) (dlq reprocess, clear) name their new places{}{}. \
             Next: point the producers at {}, run `denorm --topic {} rebuild`, then restart the workers with --topic {}",
            done.copied,
            from.topic,
            to.topic,
            to.partitions,
            started.elapsed().as_secs_f64(),
            done.moves,
            done.afters,
            done.controls,
            if done.controls_unplaced > 0 {
                format!(
                    " ({} operator request(s) name commands no letter of {dlq} records any more: a rebuild from the new topic decides them by dead-letter offsets, which may leave their keys parked)",
                    done.controls_unplaced
                )
            } else {
                String::new()
            },
            if done.dropped > 0 { format!(" ({} chunk(s) whose rename could not be read were left out: the rebuild writes those moves anew)", done.dropped) } else { String::new() },
            to.topic,
            to.topic,
            to.topic
        );
        Ok(())
    })
    .await?
}
