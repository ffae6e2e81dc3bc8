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
use denorm::verify::compare::Problem;
use denorm::verify::session::{Scratch, ScratchError, Session, Shown};
use denorm::verify::verdict::Recorded;
use denorm::verify::{Report, VerifyError};

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Print the report as JSON on stdout: {"topic","at":{partition:offset},"keys","sample_percent","checked",
    /// "written_since","unsettled","rounds","differences":[{"kind","tenant","id","problem","partition","fields":
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
    /// Verify this tenant's documents only (see docs/tenants.md): all its keys, or, with --keys
    /// or --sample, those of its keys. With --repair, only its documents are repaired
    #[arg(long, value_name = "TENANT", env = "DENORM_TENANT", value_parser = super::parse_tenant)]
    tenant: Option<String>,
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

pub async fn run(cli: &Cli, a: &VerifyArgs) -> anyhow::Result<()> {
    let members = denorm::members::Members::new(a.members, a.member).map_err(|e| UsageError(format!("--member {} of --members {}: {e}", a.member, a.members)))?;
    let run = match (&a.run, members.count) {
        (_, 1) => String::new(),
        (Some(run), _) if !run.is_empty() => run.clone(),
        _ => return Err(UsageError("--members above 1 needs --run: the name the members of one verify share, by which their verdicts combine".into()).into()),
    };
    let kafka = cli.kafka();
    // An index that is not there exits 2: there is nothing to judge.
    let model = cli.domain()?;
    let live = super::location(cli)?.backend(&kafka.topic, Access::Existing, Embedded { model, ..Embedded::with_memory(15 << 20) }).await.map_err(|e| UsageError(e.to_string()))?;
    // Its errors exit 2, not 1 (which means differences: review F14).
    let scratch = match &a.scratch_dir {
        Some(dir) => Scratch::given(dir),
        None => Scratch::temporary(&std::env::temp_dir()),
    }
    .map_err(|e| match e {
        ScratchError::NotOurs(_) => anyhow::Error::new(UsageError(e.to_string())),
        e => CouldNotVerify(e.into()).into(),
    })?;
    let keys = (!a.keys.is_empty() || a.sample.is_some() || a.tenant.is_some()).then(|| denorm::worker::KeySample {
        keys: a.keys.iter().map(|k| denorm::command::tenant::scope(a.tenant.as_deref(), k)).collect(),
        tenant: a.tenant.clone(),
        percent: a.sample,
        rotation: a.sample_rotation.number(),
    });
    let session = Arc::new(Session {
        kafka,
        live,
        scratch,
        group: cli.group.clone(),
        budget: (a.index_memory_mb as usize) << 20,
        timeout: Duration::from_secs(a.timeout_secs),
        rounds: a.rounds,
        members,
        runtime: tokio::runtime::Handle::current(),
        model,
    });
    let started = std::time::Instant::now();
    // A repair mends at most --max-repairs differences (memory stays
    // bounded: review F13); the report lists the first ones.
    let (max, repair, max_differences) = (if a.repair { a.max_repairs } else { a.max_differences }, a.repair, a.max_differences);
    let mut report = blocking(&session, move |s| s.verify(keys, max, repair, &mut shown)).await?;
    if a.repair && !report.clean() {
        let first = report.clone();
        report.repair = Some(blocking(&session, move |s| s.repair(&first, max_differences, &mut shown)).await?);
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
    // A failure to record is a warning: the verdict stands.
    let (recorded, took, members) = (report.clone(), started.elapsed(), session.members);
    match blocking(&session, move |s| s.record(&recorded, left, took, &run).map_err(VerifyError::Live)).await {
        Ok(Recorded::Verdict(v)) if members.count > 1 => tracing::info!(checked = v.checked, differences = v.differences, "every member's verdict is in: recorded the verify's verdict"),
        Ok(Recorded::Verdict(_)) => {}
        Ok(Recorded::Waiting) => tracing::info!(member = members.me, "recorded this member's verdict; the verify's is recorded once every member's is in"),
        Ok(Recorded::Superseded { by_started_at }) => {
            tracing::warn!(by_started_at, "not recorded: a verify that started after this one has recorded its verdict already (the workers' denorm_verify_* gauges show that one)")
        }
        Err(error) => tracing::warn!(%error, "the verdict could not be recorded in the index (the workers' denorm_verify_* gauges stay as they were)"),
    }
    match left {
        0 => Ok(()),
        n => Err(Differences(n).into()),
    }
}

/// What the session tells a terminal (nothing when stderr is not one).
fn shown(s: Shown<'_>) {
    if !std::io::stderr().is_terminal() {
        return;
    }
    match s {
        Shown::Replay(t) => eprint!("\rreplaying the log up to the live index's offsets: {} of {} commands", t.applied, t.of),
        Shown::Replayed => eprintln!(),
        Shown::Sent(n) => eprintln!("sent {n} repair(s); waiting for the live workers to apply them"),
    }
}

/// Runs one of the session's blocking steps off the runtime's threads; its
/// failures exit 2 (could not verify).
async fn blocking<T: Send + 'static>(session: &Arc<Session>, step: impl FnOnce(&Session) -> Result<T, VerifyError> + Send + 'static) -> Result<T, CouldNotVerify> {
    let s = session.clone();
    tokio::task::spawn_blocking(move || step(&s)).await.map_err(|e| CouldNotVerify(e.into()))?.map_err(|e| CouldNotVerify(e.into()))
}

/// The report for a terminal.
fn human(r: &Report) -> String {
    let o = &r.outcome;
    let mut out = format!("verified {} document(s) of {} against a replay of its log up to offsets {} ({:.1} s)\n", o.checked, r.topic, denorm::verify::describe(&r.at), r.seconds);
    if !r.keys.is_empty() || r.sample_percent.is_some() || r.tenant.is_some() {
        let mut of = Vec::new();
        if let Some(t) = &r.tenant {
            of.push(format!("tenant {t}"));
        }
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
        let id = denorm::command::tenant::Shown(&d.id);
        out.push_str(&format!("  {} {id}: {what} (partition {}, last written at offset {} live, {} in the replay)\n", d.kind, d.partition, at(d.live_offset), at(d.replay_offset)));
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
