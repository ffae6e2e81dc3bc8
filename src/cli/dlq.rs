//! `denorm dlq`: count, list, reprocess or clear dead letters (see
//! `denorm::dlq`). Safe while workers run: reprocess and clear go through the
//! command topic, in order with the commands of the keys concerned.

use std::collections::BTreeSet;
use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::{Cli, UsageError};
use denorm::command::tenant;
use denorm::dlq::admin::{self, Entry, Marker};

#[derive(Debug, Args)]
pub struct DlqArgs {
    /// Dead-letter topic [default: <topic>.dlq]
    #[arg(long, env = "DENORM_DLQ_TOPIC", global = true)]
    dlq_topic: Option<String>,
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Count open dead letters (aborted and parked commands) by reason
    Count(Filter),
    /// List open dead letters: reason, key, origin partition/offset, attempts, time, error
    List(Filter),
    /// Re-inject the open dead letters of a key (or of all keys) in their
    /// original order, then resume the key. Letters that fail again are
    /// dead-lettered again and the key stays parked
    Reprocess(Operation),
    /// Discard the open dead letters of a key (or of all keys) and resume the key;
    /// with --letter, discard only those letters (a poison message) and keep the key parked
    Clear(ClearArgs),
}

#[derive(Debug, Args)]
struct ClearArgs {
    #[command(flatten)]
    op: Operation,
    /// Discard only this letter, as `list` shows it (PARTITION@OFFSET; repeatable): for a
    /// poison message. Its key stays parked; `reprocess --key K` then replays the key's other
    /// letters in their original order and resumes it
    #[arg(long = "letter", value_name = "PARTITION@OFFSET", value_parser = parse_letter)]
    letters: Vec<(i32, i64)>,
}

fn parse_letter(s: &str) -> Result<(i32, i64), String> {
    let bad = || format!("expected PARTITION@OFFSET as `denorm dlq list` shows it (like 0@17), got {s:?}");
    let (p, o) = s.split_once('@').ok_or_else(bad)?;
    Ok((p.trim().parse().map_err(|_| bad())?, o.trim().parse().map_err(|_| bad())?))
}

#[derive(Debug, Args, Default)]
struct Filter {
    /// Only this key (a top-level directory such as /docs, or a user id; "" for keyless messages),
    /// of --tenant when given
    #[arg(long)]
    key: Option<String>,
    /// Only this tenant's letters (see docs/tenants.md); without it, every tenant's
    #[arg(long, value_name = "TENANT", env = "DENORM_TENANT", value_parser = super::parse_tenant)]
    tenant: Option<String>,
    /// JSON output (`list`: one object per line)
    #[arg(long)]
    json: bool,
}

impl Filter {
    /// The key as it is on the wire: scoped to --tenant.
    fn wire_key(&self) -> Option<String> {
        self.key.as_ref().map(|k| tenant::scope(self.tenant.as_deref(), k))
    }

    /// Whether a letter keyed `key` (on the wire) is one of --tenant's.
    fn keeps(&self, key: &str) -> bool {
        self.tenant.as_ref().is_none_or(|t| tenant::of(key) == Some(t.as_str()))
    }
}

/// How a letter's key reads: its tenant apart (`None`: the default
/// tenant's), the key as its producer wrote it.
fn shown(e: &Entry) -> serde_json::Value {
    let mut v = serde_json::to_value(e).expect("a letter serializes");
    let (t, key) = tenant::split(&e.key);
    v["key"] = key.into();
    if let Some(t) = t {
        v["tenant"] = t.into();
    }
    v
}

/// The `--tenant T --key K` that names a key (on the wire) again.
fn key_args(key: &str) -> String {
    match tenant::split(key) {
        (Some(t), k) => format!("--tenant {t} --key {k}"),
        (None, k) => format!("--key {k}"),
    }
}

#[derive(Debug, Args)]
struct Operation {
    #[command(flatten)]
    filter: Filter,
    /// Do not ask for confirmation (`clear`)
    #[arg(long, short = 'y')]
    yes: bool,
    /// Seconds to wait for the workers (--group) to carry it out; 0: do not wait
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    wait: u64,
}

pub async fn run(cli: &Cli, a: &DlqArgs) -> anyhow::Result<()> {
    let kafka = cli.kafka();
    let topic = a.dlq_topic.clone().unwrap_or_else(|| denorm::dlq::default_topic(&kafka.topic));
    let filter = match &a.action {
        Action::Count(f) | Action::List(f) => f,
        Action::Reprocess(o) | Action::Clear(ClearArgs { op: o, .. }) => &o.filter,
    };
    let (letters, drops) = read_open(&kafka, &topic, filter).await?;
    match &a.action {
        Action::Count(f) => {
            let distinct = admin::distinct(letters);
            let by = admin::count_by_reason(&distinct);
            let keys: BTreeSet<&str> = distinct.iter().map(|e| e.key.as_str()).collect();
            if f.json {
                println!("{}", serde_json::json!({"topic": topic, "total": distinct.len(), "keys": keys.len(), "by_reason": by}));
            } else {
                println!("{} open dead letters in {topic} ({} keys)", distinct.len(), keys.len());
                for (reason, n) in by {
                    println!("{n:>10}  {reason}");
                }
            }
        }
        Action::List(f) => {
            let distinct = admin::distinct(letters);
            if f.json {
                for e in &distinct {
                    println!("{}", shown(e));
                }
            } else {
                print_table(&distinct, &mut std::io::stdout());
            }
        }
        Action::Clear(c) if !c.letters.is_empty() => drop_letters(cli, &topic, letters, c).await?,
        Action::Reprocess(o) => operate(cli, &topic, letters, &drops, o, true).await?,
        Action::Clear(c) => operate(cli, &topic, letters, &drops, &c.op, false).await?,
    }
    Ok(())
}

/// The open letters (of the filter's key and tenant), and the letters
/// dropped one by one whose key was not resumed since.
async fn read_open(kafka: &denorm::kafka::KafkaConfig, topic: &str, filter: &Filter) -> anyhow::Result<(Vec<Entry>, Vec<Marker>)> {
    let (k, t) = (kafka.clone(), topic.to_string());
    let (entries, markers) = tokio::task::spawn_blocking(move || admin::read(&k, &t)).await?.with_context(|| format!("reading the dead-letter topic {topic}"))?;
    let key = filter.wire_key();
    let open = admin::open(entries, &markers, key.as_deref()).into_iter().filter(|e| filter.keeps(&e.key)).collect();
    let drops = admin::pending_drops(&markers, key.as_deref()).into_iter().filter(|m| filter.keeps(&m.key)).collect();
    Ok((open, drops))
}

/// Asks before discarding `n` letters; without a terminal, --yes is needed.
fn confirm(n: usize, keys: usize, yes: bool) -> anyhow::Result<bool> {
    if yes {
        return Ok(true);
    }
    if !std::io::stdin().is_terminal() {
        return Err(UsageError(format!("refusing to discard {n} dead letters of {keys} keys without --yes")).into());
    }
    eprint!("Discard {n} dead letters of {keys} keys for good? [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    let yes = matches!(answer.trim(), "y" | "Y" | "yes");
    if !yes {
        eprintln!("nothing discarded");
    }
    Ok(yes)
}

/// `clear --letter`: discards the named letters alone; their keys stay
/// parked for a `reprocess` of the rest.
async fn drop_letters(cli: &Cli, topic: &str, open: Vec<Entry>, c: &ClearArgs) -> anyhow::Result<()> {
    let mut chosen = Vec::new();
    for &(p, o) in &c.letters {
        match open.iter().find(|e| e.dlq_partition == p && e.dlq_offset == o) {
            Some(e) => chosen.push(e.clone()),
            None => {
                let of_key = c.op.filter.key.as_ref().map(|k| format!(" of key {k:?}")).unwrap_or_default();
                return Err(UsageError(format!("{p}@{o} is not an open dead letter{of_key} in {topic} (see `denorm dlq list`)")).into());
            }
        }
    }
    let keys: BTreeSet<String> = chosen.iter().map(|e| e.key.clone()).collect();
    if !confirm(chosen.len(), keys.len(), c.op.yes)? {
        return Ok(());
    }
    let (k, t) = (cli.kafka(), topic.to_string());
    let dropped = tokio::task::spawn_blocking(move || admin::drop_letters(&k, &t, &chosen, &open)).await?.context("writing to the dead-letter topic")?;
    let (left, _) = read_open(&cli.kafka(), topic, &Filter::default()).await?;
    let left = admin::distinct(left.into_iter().filter(|e| keys.contains(&e.key)).collect());
    if c.op.filter.json {
        println!("{}", serde_json::json!({"action": "drop", "letters": dropped.len(), "keys": keys.len(), "still_open": left.len()}));
    }
    eprintln!("dropped {} dead letters; their keys stay parked", dropped.len());
    for key in &keys {
        let n = left.iter().filter(|e| &e.key == key).count();
        eprintln!("  key {key:?}: {n} open letters left; `denorm dlq reprocess {}` replays them in their original order and resumes the key", key_args(key));
    }
    Ok(())
}

/// The letters as a table on `out`.
fn print_table(letters: &[Entry], out: &mut dyn std::io::Write) {
    let _ = writeln!(out, "{:<14} {:<18} {:<12} {:<24} {:<14} {:>8} {:<24} detail", "letter", "reason", "tenant", "key", "origin", "attempts", "dead-lettered (UTC)");
    for e in letters {
        let at = format_millis(e.dead_lettered_at);
        let detail = match &e.parked_behind {
            Some(b) => format!("behind {b}"),
            None => e.detail.clone(),
        };
        let (tenant, key) = tenant::split(&e.key);
        let _ = writeln!(
            out,
            "{:<14} {:<18} {:<12} {:<24} {:<14} {:>8} {:<24} {}",
            format!("{}@{}", e.dlq_partition, e.dlq_offset),
            e.reason,
            tenant.unwrap_or("-"),
            if key.is_empty() { "(none)" } else { key },
            format!("{}@{}", e.origin_partition, e.origin_offset),
            e.attempts,
            at,
            detail
        );
    }
}

/// `YYYY-MM-DD HH:MM:SS` of Unix milliseconds (UTC).
fn format_millis(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

async fn operate(cli: &Cli, topic: &str, letters: Vec<Entry>, drops: &[Marker], o: &Operation, reprocess: bool) -> anyhow::Result<()> {
    let groups = admin::groups(letters, drops);
    let n: usize = groups.iter().map(|g| g.entries.len()).sum();
    let verb = if reprocess { "reprocess" } else { "discard" };
    if groups.is_empty() {
        eprintln!("no open dead letters{} in {topic}: nothing to {verb}", o.filter.key.as_ref().map(|k| format!(" for key {k:?}")).unwrap_or_default());
        return Ok(());
    }
    if !reprocess && !confirm(n, groups.len(), o.yes)? {
        return Ok(());
    }
    let kafka = cli.kafka();
    let wait = (o.wait > 0).then(|| Duration::from_secs(o.wait));
    let done = admin::carry_out(&kafka, topic, &cli.group, groups, reprocess, wait).await?;
    if done.filled > 0 {
        eprintln!("{} letter(s) without their command (over the dead-letter topic's message limit): read from {} at their origin", done.filled, kafka.topic);
    }
    let keys = done.groups.len();
    eprintln!("{verb}: {n} dead letters of {keys} keys handed to the workers (group {})", cli.group);
    let Some(still) = done.still_open else {
        if o.filter.json {
            println!("{}", serde_json::json!({"action": verb, "letters": n, "keys": keys, "still_open": null}));
        }
        return Ok(());
    };
    if o.filter.json {
        let distinct: BTreeSet<&str> = done.groups.iter().map(|g| g.key.as_str()).collect();
        println!("{}", serde_json::json!({"action": verb, "letters": n, "keys": distinct.len(), "still_open": still.len()}));
    }
    if still.is_empty() {
        eprintln!("done: every key resumed");
    } else {
        let parked: BTreeSet<&str> = still.iter().map(|e| e.key.as_str()).collect();
        eprintln!("done, but {} dead letters of {} keys are open again (failed again, or new commands arrived meanwhile):", still.len(), parked.len());
        // With --json, stdout holds the report alone.
        match o.filter.json {
            true => print_table(&still, &mut std::io::stderr()),
            false => print_table(&still, &mut std::io::stdout()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_utc_times() {
        assert_eq!(super::format_millis(0), "1970-01-01 00:00:00");
        assert_eq!(super::format_millis(1_795_000_000_000), "2026-11-18 11:06:40");
        assert_eq!(super::format_millis(951_782_400_000), "2000-02-29 00:00:00");
    }
}
