//! `denorm verify`: the arguments, the live index, the progress shown and
//! the report; the verify itself is [`crate::verify`]. Exits 0 when the
//! live index equals the replay of its log, 1 on differences, 2 when it
//! could not verify.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::{Cli, UsageError};
use crate::index::elastic::backend::ElasticBackend;
use crate::index::embedded::{EmbeddedBackend, EmbeddedIndex};
use crate::index::Backend;
use crate::verify::compare::Problem;
use crate::verify::{Report, Verify};

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Print the report as JSON on stdout: {"topic","at":{partition:offset},"keys","sample_percent","checked",
    /// "written_since","unsettled","differences":[{"kind","id","problem","partition","fields":
    /// [{"field","expected","actual"}],"live_offset","replay_offset"}],"differences_total","seconds"}
    #[arg(long)]
    json: bool,
    /// Differences listed in the report (all are counted)
    #[arg(long, default_value_t = 100)]
    max_differences: usize,
    /// Directory of the scratch index the log is replayed into (default: a temporary
    /// directory, removed afterwards). It needs about the room of an embedded copy of the index
    #[arg(long, env = "DENORM_VERIFY_SCRATCH_DIR")]
    scratch_dir: Option<std::path::PathBuf>,
    /// Verify these keys only (top-level directories such as /clinton, user ids), each with
    /// every document of it: the replay applies their commands only
    #[arg(long, value_delimiter = ',')]
    keys: Vec<String>,
    /// Verify about this percent of all keys (chosen by a hash of the key: the same keys on
    /// every run), each with every document of it; with --keys, those as well
    #[arg(long, env = "DENORM_VERIFY_SAMPLE", value_parser = parse_percent)]
    sample: Option<f64>,
    /// Give up (exit 2) when the replay has not reached the live index's offsets by then
    #[arg(long, env = "DENORM_VERIFY_TIMEOUT_SECS", default_value_t = 3600)]
    timeout_secs: u64,
    /// Indexing memory budget of the scratch index per partition, in MiB (at least 15)
    #[arg(long, env = "DENORM_INDEX_MEMORY_MB", default_value_t = 64, value_parser = clap::value_parser!(u64).range(15..=4096))]
    index_memory_mb: u64,
}

fn parse_percent(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 100.0 => Ok(p),
        _ => Err(format!("expected a percent above 0 and at most 100, got {s:?}")),
    }
}

/// The verify found differences: exit status 1 (the report is printed).
#[derive(Debug, thiserror::Error)]
#[error("{0} document(s) differ from the replay of the log")]
pub struct Differences(pub usize);

/// The verify could not decide: exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("could not verify: {0:#}")]
pub struct CouldNotVerify(pub anyhow::Error);

pub async fn run(cli: &Cli, a: &VerifyArgs) -> anyhow::Result<()> {
    let kafka = cli.kafka();
    let rt = tokio::runtime::Handle::current();
    let live: Arc<dyn Backend> = match super::elastic_url(cli) {
        Some(url) => {
            let es = super::elastic_config(&url)?;
            Arc::new(ElasticBackend::new(es.client()?, &es.prefix, &kafka.topic, rt.clone()))
        }
        None => {
            let index = EmbeddedIndex::open_existing(&cli.index).map_err(|e| UsageError(format!("opening the index {}: {e}", cli.index.display())))?;
            Arc::new(EmbeddedBackend::new(index, 15 << 20))
        }
    };
    let (scratch, _temp) = match &a.scratch_dir {
        Some(dir) => {
            if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
                return Err(UsageError(format!("--scratch-dir {} is not empty", dir.display())).into());
            }
            (dir.clone(), None)
        }
        None => {
            let t = tempfile::Builder::new().prefix("denorm-verify-").tempdir()?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let keys = (!a.keys.is_empty() || a.sample.is_some()).then(|| crate::worker::KeySample { keys: a.keys.iter().cloned().collect(), percent: a.sample });
    let (group, budget, max, timeout, json) = (cli.group.clone(), (a.index_memory_mb as usize) << 20, a.max_differences, Duration::from_secs(a.timeout_secs), a.json);
    let report = tokio::task::spawn_blocking(move || {
        let show = std::io::stderr().is_terminal();
        let v = Verify { kafka, live: live.as_ref(), scratch: &scratch, group, budget, max_differences: max, timeout, keys, delete_group: true, runtime: rt };
        crate::verify::run(v, |t| {
            if show {
                eprint!("\rreplaying the log up to the live index's offsets: {} of {} commands", t.applied, t.of);
            }
        })
        .inspect(|_| {
            if show {
                eprintln!();
            }
        })
    })
    .await?
    .map_err(|e| CouldNotVerify(e.into()))?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", human(&report));
    }
    match report.clean() {
        true => Ok(()),
        false => Err(Differences(report.outcome.differences_total).into()),
    }
}

/// The report for a terminal.
fn human(r: &Report) -> String {
    let o = &r.outcome;
    let mut out = format!(
        "verified {} document(s) of {} against a replay of its log up to offsets {} ({:.1} s)\n",
        o.checked,
        r.topic,
        crate::verify::describe(&r.at),
        r.seconds
    );
    if !r.keys.is_empty() || r.sample_percent.is_some() {
        let mut of = Vec::new();
        if !r.keys.is_empty() {
            of.push(format!("keys {}", r.keys.join(", ")));
        }
        if let Some(p) = r.sample_percent {
            of.push(format!("{p}% of all keys"));
        }
        out.push_str(&format!("  of {} only, each with every document of it\n", of.join(" and ")));
    }
    if o.written_since + o.unsettled > 0 {
        out.push_str(&format!("  not compared: {} written since those offsets, {} missing in a partition that moved on meanwhile\n", o.written_since, o.unsettled));
    }
    if r.clean() {
        out.push_str("equal: no differences\n");
        return out;
    }
    out.push_str(&format!("{} difference(s){}:\n", o.differences_total, if o.differences.len() < o.differences_total { format!(", the first {}", o.differences.len()) } else { String::new() }));
    for d in &o.differences {
        let what = match d.problem {
            Problem::Missing => "missing from the live index",
            Problem::Unexpected => "in the live index, not in the log's replay",
            Problem::Differs => "differs",
        };
        let at = |o: Option<u64>| o.map_or("-".to_string(), |o| o.to_string());
        out.push_str(&format!("  {} {}: {what} (partition {}, last written at offset {} live, {} in the replay)\n", d.kind, d.id, d.partition, at(d.live_offset), at(d.replay_offset)));
        for f in &d.fields {
            out.push_str(&format!("    {}: expected {}, found {}\n", f.field, f.expected, f.actual));
        }
    }
    out
}
