//! `denorm verify`: the arguments, the live index, the progress shown and
//! the report; the verify itself is [`denorm::verify`]. Exits 0 when the
//! live index equals the replay of its log, 1 on differences, 2 when it
//! could not verify.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::{Cli, UsageError};
use denorm::index::open::{Access, Embedded};
use denorm::index::Backend;
use denorm::verify::compare::Problem;
use denorm::verify::{Report, Verify};

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Print the report as JSON on stdout: {"topic","at":{partition:offset},"keys","sample_percent","checked",
    /// "written_since","unsettled","rounds","differences":[{"kind","id","problem","partition","fields":
    /// [{"field","expected","actual"}],"live_offset","replay_offset","elsewhere"}],"differences_total","seconds",
    /// with --repair "repair":{"sent","not_repaired","beyond_max_repairs","after","error"} and "remaining"}. The replay decides
    /// each message with the settings the live workers recorded in the index (docs/verify.md)
    #[arg(long)]
    json: bool,
    /// Differences listed in the report (all are counted)
    #[arg(long, default_value_t = 100)]
    max_differences: usize,
    /// With --repair: differences repaired at most by one run (those beyond are counted, not
    /// repaired, and the exit status is 1: run it again). Bounds the verify's memory: each is
    /// held with its two documents
    #[arg(long, env = "DENORM_VERIFY_MAX_REPAIRS", default_value_t = 10_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_repairs: usize,
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
    /// Which sample --sample takes: a number (0, the default: the same keys every run; another
    /// number, other keys), or `daily`: the day's number, so that each day's verify looks at
    /// other keys
    #[arg(long, env = "DENORM_VERIFY_SAMPLE_ROTATION", default_value = "0", value_parser = parse_rotation)]
    sample_rotation: Rotation,
    /// Give up (exit 2) when the replay has not reached the live index's offsets by then
    #[arg(long, env = "DENORM_VERIFY_TIMEOUT_SECS", default_value_t = 3600)]
    timeout_secs: u64,
    /// Rounds at most: while a round leaves documents written since its snapshot (or missing in
    /// a partition that moved on), the next checks everything again at the live index's newer
    /// offsets, replaying only the log between
    #[arg(long, env = "DENORM_VERIFY_ROUNDS", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
    /// Repair what differs through the log: send, for each differing document, a command under
    /// its key that restores the replay's version unless the document was written since; wait
    /// until the live workers applied them (within --timeout-secs), then verify those keys
    /// again, and exit with that verify's status
    #[arg(long)]
    repair: bool,
    /// How many processes verify the index together (a Job with `parallelism` and `completions` N,
    /// `completionMode: Indexed`): each replays and compares its share of the partitions
    /// (partitions p with p mod N = --member), and the verdicts of one --run combine into one
    /// record (the workers' denorm_verify_* gauges) once every member's is in
    #[arg(long, env = "DENORM_VERIFY_MEMBERS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    members: u32,
    /// Which member this process is, 0 to --members minus 1 (in the chart, the pod's completion index)
    #[arg(long, env = "DENORM_VERIFY_MEMBER", default_value_t = 0)]
    member: u32,
    /// With --members: the name the members of one verify share (in the chart, the Job's name),
    /// by which their verdicts are combined
    #[arg(long, env = "DENORM_VERIFY_RUN")]
    run: Option<String>,
    /// Indexing memory budget of the scratch index per partition, in MiB (at least 15)
    #[arg(long, env = "DENORM_INDEX_MEMORY_MB", default_value_t = 64, value_parser = clap::value_parser!(u64).range(15..=4096))]
    index_memory_mb: u64,
}

/// `--sample-rotation`.
#[derive(Debug, Clone, Copy)]
enum Rotation {
    Fixed(u64),
    Daily,
}

impl Rotation {
    fn number(self) -> u64 {
        match self {
            Rotation::Fixed(n) => n,
            // Days since the Unix epoch (never 0 again).
            Rotation::Daily => (denorm::clock::now_millis() / 86_400_000) as u64,
        }
    }
}

fn parse_rotation(s: &str) -> Result<Rotation, String> {
    match s {
        "daily" => Ok(Rotation::Daily),
        n => n.parse().map(Rotation::Fixed).map_err(|_| format!("expected a number or `daily`, got {s:?}")),
    }
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

/// What each verify of one run shares.
struct Setup {
    kafka: denorm::kafka::KafkaConfig,
    live: Arc<dyn Backend>,
    scratch: std::path::PathBuf,
    group: String,
    budget: usize,
    timeout: Duration,
    rounds: u32,
    members: denorm::members::Members,
}

impl Setup {
    /// Where the live index stands now (its reads block).
    async fn positions(&self, partitions: i32) -> Result<denorm::verify::compare::Positions, CouldNotVerify> {
        let live = self.live.clone();
        let got = tokio::task::spawn_blocking(move || denorm::verify::positions(live.as_ref(), partitions)).await;
        got.map_err(|e| CouldNotVerify(e.into()))?.map_err(|e| CouldNotVerify(e.into()))
    }

    /// One verify, into the (empty) scratch directory, which it leaves
    /// empty again.
    async fn verify(&self, keys: Option<denorm::worker::KeySample>, max: usize, for_repair: bool) -> Result<Report, CouldNotVerify> {
        let (kafka, live, scratch, group, budget, timeout, rounds, members) =
            (self.kafka.clone(), self.live.clone(), self.scratch.clone(), self.group.clone(), self.budget, self.timeout, self.rounds, self.members);
        let rt = tokio::runtime::Handle::current();
        let report = tokio::task::spawn_blocking(move || {
            let show = std::io::stderr().is_terminal();
            let v = Verify { kafka, live: live.as_ref(), scratch: &scratch, group, budget, max_differences: max, for_repair, timeout, keys, rounds, delete_group: true, runtime: rt, members };
            let report = denorm::verify::run(v, |t| {
                if show {
                    eprint!("\rreplaying the log up to the live index's offsets: {} of {} commands", t.applied, t.of);
                }
            });
            if show {
                eprintln!();
            }
            report
        })
        .await
        .map_err(|e| CouldNotVerify(e.into()))?;
        // Emptied whatever the outcome: a --scratch-dir left full by a
        // verify that could not decide made the next one refuse it (review
        // F14).
        let emptied = empty(&self.scratch).map_err(|e| CouldNotVerify(e.into()));
        let report = report.map_err(|e| CouldNotVerify(e.into()))?;
        emptied?;
        Ok(report)
    }
}

/// The file that marks a `--scratch-dir` as a verify's (kept when it is
/// emptied after a run).
const SCRATCH_MARK: &str = ".denorm-verify-scratch";
/// A verify's temporary scratch directory, and the file in it naming the
/// process that owns it.
const TEMP_PREFIX: &str = "denorm-verify-";
const OWNER_FILE: &str = ".denorm-verify-owner";

/// Removes the temporary scratch directories of verifies that were killed
/// (SIGKILL, OOM, the Job's deadline) on this machine: those whose owner
/// process is gone (review of verify, F14 b: each held the room of an
/// embedded copy of the index until someone deleted it). Best effort.
fn sweep_killed(temp: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(temp) else { return };
    for dir in entries.flatten().map(|e| e.path()).filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(TEMP_PREFIX))) {
        let Some(pid) = std::fs::read_to_string(dir.join(OWNER_FILE)).ok().and_then(|t| t.trim().parse::<u32>().ok()) else { continue };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => tracing::warn!(dir = %dir.display(), pid, "removed the scratch directory of a verify that was killed"),
                Err(error) => tracing::warn!(dir = %dir.display(), %error, "could not remove the scratch directory of a verify that was killed"),
            }
        }
    }
}

/// Removes what a directory holds (but its mark as a scratch directory).
fn empty(dir: &std::path::Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.file_name().is_some_and(|n| n == SCRATCH_MARK || n == OWNER_FILE) {
            continue;
        }
        if path.is_dir() {
            std::fs::remove_dir_all(path)?;
        } else {
            std::fs::remove_file(path)?;
        }
    }
    Ok(())
}

pub async fn run(cli: &Cli, a: &VerifyArgs) -> anyhow::Result<()> {
    let members = denorm::members::Members::new(a.members, a.member).map_err(|e| UsageError(format!("--member {} of --members {}: {e}", a.member, a.members)))?;
    let run = match (&a.run, members.count) {
        (_, 1) => String::new(),
        (Some(run), _) if !run.is_empty() => run.clone(),
        _ => return Err(UsageError("--members above 1 needs --run: the name the members of one verify share, by which their verdicts combine".into()).into()),
    };
    let kafka = cli.kafka();
    // An index that is not there exits 2: there is nothing to judge.
    let live = super::location(cli)?.backend(&kafka.topic, Access::Existing, Embedded::with_memory(15 << 20)).await.map_err(|e| UsageError(e.to_string()))?;
    // Its errors exit 2, not 1 (which means differences: review F14).
    let scratch_err = |e: std::io::Error, what: &str| CouldNotVerify(anyhow::Error::new(e).context(what.to_string()));
    let (scratch, _temp) = match &a.scratch_dir {
        Some(dir) => {
            let what = format!("the scratch directory {}", dir.display());
            if dir.exists() && std::fs::read_dir(dir).map_err(|e| scratch_err(e, &what))?.next().is_some() {
                // A verify killed (SIGKILL, the Job's deadline) leaves its
                // scratch copy, marked as such: emptied, it blocks nothing
                // (review F14). Anything else is not ours to delete.
                if !dir.join(SCRATCH_MARK).exists() {
                    return Err(UsageError(format!("--scratch-dir {} is not empty (and not a scratch directory a verify left)", dir.display())).into());
                }
                tracing::warn!(dir = %dir.display(), "--scratch-dir holds what an earlier verify left (killed?): emptied");
                empty(dir).map_err(|e| scratch_err(e, &what))?;
            }
            std::fs::create_dir_all(dir).map_err(|e| scratch_err(e, &what))?;
            std::fs::write(dir.join(SCRATCH_MARK), "a denorm verify's scratch directory: emptied by the next verify\n").map_err(|e| scratch_err(e, &what))?;
            (dir.clone(), None)
        }
        None => {
            sweep_killed(&std::env::temp_dir());
            let t = tempfile::Builder::new().prefix(TEMP_PREFIX).tempdir().map_err(|e| scratch_err(e, "a temporary scratch directory"))?;
            std::fs::write(t.path().join(OWNER_FILE), std::process::id().to_string()).map_err(|e| scratch_err(e, "a temporary scratch directory"))?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let keys = (!a.keys.is_empty() || a.sample.is_some()).then(|| denorm::worker::KeySample { keys: a.keys.iter().cloned().collect(), percent: a.sample, rotation: a.sample_rotation.number() });
    let setup = Setup { kafka, live, scratch, group: cli.group.clone(), budget: (a.index_memory_mb as usize) << 20, timeout: Duration::from_secs(a.timeout_secs), rounds: a.rounds, members };
    let started = std::time::Instant::now();
    // A repair mends at most --max-repairs differences (memory stays
    // bounded: review F13); the report lists the first ones.
    let mut report = match a.repair {
        true => setup.verify(keys, a.max_repairs, true).await?,
        false => setup.verify(keys, a.max_differences, false).await?,
    };
    if a.repair && !report.clean() {
        report.repair = Some(repair(&setup, &report, a.max_differences).await?);
    }
    report.outcome.differences.truncate(a.max_differences);
    let left = match &report.repair {
        Some(r) => r.left(),
        None => report.outcome.differences_total,
    };
    // With --repair, what the exit status counts (review F18).
    report.remaining = report.repair.as_ref().filter(|r| r.error.is_none()).map(|_| left);
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", human(&report));
    }
    if let Some(error) = report.repair.as_ref().and_then(|r| r.error.clone()) {
        return Err(CouldNotVerify(anyhow::anyhow!(error)).into());
    }
    record(&setup, &report, left, started.elapsed(), &run).await;
    match left {
        0 => Ok(()),
        n => Err(Differences(n).into()),
    }
}

/// Records the verdict in the live index (see [`denorm::verify::verdict`]),
/// where the workers export it as the `denorm_verify_*` gauges. A failure
/// to record is a warning: the verdict stands.
async fn record(setup: &Setup, report: &Report, left: usize, took: Duration, run: &str) {
    use denorm::verify::verdict::Recorded;
    let (live, members, run) = (setup.live.clone(), setup.members, run.to_string());
    let o = &report.outcome;
    let found = denorm::verify::verdict::Found {
        checked: o.checked,
        differences: left as u64,
        seconds: took.as_secs_f64(),
        partial: !report.keys.is_empty() || report.sample_percent.is_some(),
        written_since: o.written_since,
        unsettled: o.unsettled,
    };
    let recorded = tokio::task::spawn_blocking(move || denorm::verify::verdict::record(live.as_ref(), found, members, &run)).await;
    match recorded {
        Ok(Ok(Recorded::Verdict(v))) if members.count > 1 => tracing::info!(checked = v.checked, differences = v.differences, "every member's verdict is in: recorded the verify's verdict"),
        Ok(Ok(Recorded::Verdict(_))) => {}
        Ok(Ok(Recorded::Waiting)) => tracing::info!(member = members.me, "recorded this member's verdict; the verify's is recorded once every member's is in"),
        Ok(Ok(Recorded::Superseded { by_started_at })) => {
            tracing::warn!(by_started_at, "not recorded: a verify that started after this one has recorded its verdict already (the workers' denorm_verify_* gauges show that one)")
        }
        Ok(Err(error)) => tracing::warn!(%error, "the verdict could not be recorded in the index (the workers' denorm_verify_* gauges stay as they were)"),
        Err(error) => tracing::warn!(%error, "recording the verdict failed"),
    }
}

/// `--repair`: sends the repairs of `report`'s differences, waits until the
/// live index has applied them, and verifies their keys again.
async fn repair(setup: &Setup, report: &Report, max: usize) -> Result<denorm::verify::repair::Repaired, CouldNotVerify> {
    let fail = |e: anyhow::Error| CouldNotVerify(e);
    let partitions = setup.kafka.topic_partitions().map_err(|e| fail(e.into()))?.unwrap_or(report.at.len() as i32);
    // Held here by the test of review F3 (fault point verify.before-plan).
    tokio::task::spawn_blocking(|| denorm::faults::hold("verify.before-plan")).await.map_err(|e| fail(e.into()))?;
    // Where the live index and its log stand now: a document missing in a
    // partition whose checkpoint moved since the verify, or whose log holds
    // anything past where the verify compared it (a delete not applied
    // yet: review F3), is not repaired (see `repair::plan`).
    let now = setup.positions(partitions).await?;
    let (kafka, at) = (setup.kafka.clone(), report.at.clone());
    let moved = tokio::task::spawn_blocking(move || denorm::verify::moved_past(&kafka, partitions, &at, &[&now])).await.map_err(|e| fail(e.into()))?.map_err(|e| fail(e.into()))?;
    let plan = denorm::verify::repair::plan(&report.outcome.differences, &report.at, &|p| moved.contains(&p));
    let beyond = report.outcome.differences_total - report.outcome.differences.len();
    let producer = denorm::produce::Producer::new(&setup.kafka).map_err(|e| fail(e.into()))?;
    let mut sent = Vec::new();
    for e in &plan.commands {
        let at = producer.send_envelope(e).await.map_err(|e| fail(e.into()))?;
        let (kind, id) = denorm::apply::document(&e.command).expect("a repair has one document");
        sent.push(denorm::verify::repair::Sent { kind: kind.as_str(), id: id.to_string(), key: e.command.key().to_string(), command: e.command.kind(), partition: at.partition, offset: at.offset });
    }
    if std::io::stderr().is_terminal() {
        eprintln!("sent {} repair(s); waiting for the live workers to apply them", sent.len());
    }
    // Applied once each partition's checkpoint reaches its last repair.
    let mut want: std::collections::BTreeMap<i32, i64> = std::collections::BTreeMap::new();
    for s in &sent {
        let w = want.entry(s.partition).or_insert(s.offset);
        *w = (*w).max(s.offset);
    }
    let (live, timeout) = (setup.live.clone(), setup.timeout);
    let want: Vec<(i32, i64)> = want.into_iter().collect();
    let waited = tokio::task::spawn_blocking(move || denorm::verify::reach::until_reached(timeout, Duration::from_millis(200), &want, || denorm::verify::positions(live.as_ref(), partitions))).await;
    if let Err(b) = waited.map_err(|e| CouldNotVerify(e.into()))?.map_err(|e| CouldNotVerify(e.into()))? {
        // The repairs are in the log: the report names them (review F12: it
        // printed nothing), then the verify exits 2.
        let error = format!("the live workers did not apply the repair at partition {} offset {} within {} s (are they running?)", b.partition, b.want, timeout.as_secs());
        return Ok(denorm::verify::repair::Repaired { sent, not_repaired: plan.not_repaired, beyond_max_repairs: beyond, after: None, error: Some(error) });
    }
    let after = match plan.commands.is_empty() {
        true => None,
        false => {
            let keys = denorm::worker::KeySample { keys: plan.keys().into_iter().collect(), percent: None, rotation: 0 };
            // Lists every repair that did not take (see `Repaired::left`).
            let after = setup.verify(Some(keys), max.max(sent.len()), false).await?;
            Some(Box::new(after))
        }
    };
    Ok(denorm::verify::repair::Repaired { sent, not_repaired: plan.not_repaired, beyond_max_repairs: beyond, after, error: None })
}

/// The report for a terminal.
fn human(r: &Report) -> String {
    let o = &r.outcome;
    let mut out = format!("verified {} document(s) of {} against a replay of its log up to offsets {} ({:.1} s)\n", o.checked, r.topic, denorm::verify::describe(&r.at), r.seconds);
    if !r.keys.is_empty() || r.sample_percent.is_some() {
        let mut of = Vec::new();
        if !r.keys.is_empty() {
            of.push(format!("keys {}", r.keys.join(", ")));
        }
        if let Some(p) = r.sample_percent {
            of.push(format!("{p}% of all keys (sample rotation {})", r.sample_rotation));
        }
        out.push_str(&format!("  of {} only, each with every document of it\n", of.join(" and ")));
    }
    if let Some((me, count)) = r.member {
        out.push_str(&format!("  member {me} of {count}: the partitions above only (each member verifies its share)\n"));
    }
    if r.rounds > 1 {
        out.push_str(&format!("  in {} rounds: what was written since a round's offsets was checked again at the next one's (these are the last round's)\n", r.rounds));
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
    if let Some(rep) = &r.repair {
        out.push_str(&format!("repair: sent {} command(s) through the log", rep.sent.len()));
        if let Some(last) = rep.sent.iter().map(|s| (s.partition, s.offset)).max_by_key(|(_, o)| *o) {
            out.push_str(&format!(", applied by the live workers (last at partition {} offset {})", last.0, last.1));
        }
        out.push('\n');
        for s in &rep.sent {
            out.push_str(&format!("  {} {}: {} under key {} at partition {} offset {}\n", s.kind, s.id, s.command, s.key, s.partition, s.offset));
        }
        for n in &rep.not_repaired {
            out.push_str(&format!("  {} {}: not repaired: {}\n", n.kind, n.id, n.reason));
        }
        if rep.beyond_max_repairs > 0 {
            out.push_str(&format!("  {} more difference(s) not repaired: beyond --max-repairs (run the repair again)\n", rep.beyond_max_repairs));
        }
        if let Some(after) = &rep.after {
            out.push_str("after the repair, its keys verified again:\n");
            for line in human(after).lines() {
                out.push_str(&format!("  {line}\n"));
            }
        }
    }
    out
}
