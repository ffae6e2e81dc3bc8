//! `denorm rebuild`: the arguments, the backend, the metrics endpoint and
//! the progress shown; the rebuild itself is [`denorm::rebuild`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use tracing::info;

use super::{Cli, UsageError};
use denorm::http::{self, Health};
use denorm::index::generations::Generations;
use denorm::kafka::KafkaConfig;
use denorm::rebuild::{Rebuild, RebuildError, Tick};

#[derive(Debug, Args)]
pub struct RebuildArgs {
    /// Print the index's generations, the model each holds, and the state of a rebuild in
    /// progress, and exit
    #[arg(long)]
    status: bool,
    /// With --status: print JSON
    #[arg(long, requires = "status")]
    json: bool,
    /// Give up a rebuild that did not finish (stop it first): delete the generation it was
    /// building and its state, and exit. Also mends a state that cannot be read
    #[arg(long, conflicts_with = "status")]
    abandon: bool,
    /// Rebuild from what is left of a topic whose first commands retention deleted, instead of
    /// refusing: the new generation lacks their effects, and the rebuild says which offsets it
    /// skipped
    #[arg(long, env = "DENORM_REBUILD_ACCEPT_GAPS")]
    accept_gaps: bool,
    /// Cut over although the rebuild met documents another key's partition held (Elasticsearch:
    /// owner changes sent without their explicit form, whose outcome depends on which writer comes
    /// first); without it such a rebuild stops before the cutover and names them
    #[arg(long, env = "DENORM_REBUILD_ACCEPT_OWNER_CONFLICTS")]
    accept_owner_conflicts: bool,
    /// Before the cutover, compare the new generation with the live one document by document, over
    /// what both have applied (waiting for the live workers to apply as much); on any difference,
    /// name the documents and do not cut over
    #[arg(long, env = "DENORM_REBUILD_VERIFY")]
    verify: bool,
    /// With --verify: cut over despite differences (they are reported)
    #[arg(long, requires = "verify")]
    force: bool,
    /// With --verify: how long to wait for the live workers to apply as much as the new generation
    #[arg(long, env = "DENORM_REBUILD_VERIFY_WAIT_SECS", default_value_t = 600)]
    verify_wait_secs: u64,
    /// Keep the previous generation after the cutover (default: deleted once no worker
    /// writes to it: its directory, or its Elasticsearch indexes and meta documents)
    #[arg(long, env = "DENORM_REBUILD_KEEP_OLD")]
    keep_old: bool,
    /// Address of the rebuild's /metrics, /healthz and /readyz endpoint (loopback by default)
    #[arg(long, env = "DENORM_REBUILD_METRICS_ADDR", default_value = "127.0.0.1:9465")]
    metrics_addr: std::net::SocketAddr,
    /// Indexing memory budget per partition shard, in MiB (at least 15)
    #[arg(long, env = "DENORM_INDEX_MEMORY_MB", default_value_t = 64, value_parser = clap::value_parser!(u64).range(15..=4096))]
    index_memory_mb: u64,
    /// How many processes build the new generation together (a Job with `parallelism` and
    /// `completions` N, `completionMode: Indexed`): each builds the shards of the partitions the
    /// rebuild's consumer group gives it, and member 0 cuts over once every partition has caught up.
    /// Every member of one rebuild must be given the same count
    #[arg(long, env = "DENORM_REBUILD_MEMBERS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    members: u32,
    /// Which member this process is, 0 to --members minus 1 (in the chart, the pod's completion
    /// index). Member 0 begins or resumes the rebuild and cuts over; a member replaced under the same
    /// number takes its partitions back
    #[arg(long, env = "DENORM_REBUILD_MEMBER", default_value_t = 0)]
    member: u32,
    /// Rebuild one tenant's own Elasticsearch indexes alone (a tenant named in
    /// DENORM_ES_DEDICATED_TENANTS when the current generation was created): its commands are
    /// replayed into a new revision while every tenant is served and updated, then that tenant
    /// is cut over (with --abandon: give such a rebuild up). A tenant in the shared indexes
    /// that DENORM_ES_DEDICATED_TENANTS names now moves into indexes of its own this way. Run
    /// with the --model the generation holds, if it holds one. See docs/tenants.md
    #[arg(long, value_parser = super::parse_tenant, conflicts_with_all = ["status", "verify", "accept_gaps", "accept_owner_conflicts"])]
    tenant: Option<String>,
    /// With --tenant: move the tenant from its own indexes into the shared ones, alone (take it
    /// out of DENORM_ES_DEDICATED_TENANTS first). See docs/tenants.md
    #[arg(long, requires = "tenant")]
    to_shared: bool,
    /// Rebuild into the model given with --model (or into the compiled-in kinds alone, without
    /// one) although the live generation holds another: the new generation holds the new model,
    /// and at the cutover the live workers of the old one stop, to be started again with the new
    /// --model. Without it such a rebuild is refused before it builds anything. See docs/model.md
    #[arg(long, env = "DENORM_REBUILD_CHANGE_MODEL", conflicts_with_all = ["status", "abandon", "tenant"])]
    change_model: bool,
    #[command(flatten)]
    cross_key: super::CrossKeyArgs,
}

pub async fn run(cli: &Cli, a: &RebuildArgs) -> anyhow::Result<()> {
    let members = denorm::members::Members::new(a.members, a.member).map_err(|e| UsageError(format!("--member {} of --members {}: {e}", a.member, a.members)))?;
    let kafka = cli.kafka();
    let rt = tokio::runtime::Handle::current();
    // A rebuild creates indexes and moves aliases; its status and its
    // abandonment do neither.
    let manage = !a.status && !a.abandon;
    if let Some(t) = &a.tenant {
        return tenant_rebuild(cli, a, t, manage).await;
    }
    let model = cli.domain()?;
    let index = super::location(cli)?.generations(&kafka.topic, manage, (a.index_memory_mb as usize) << 20, model).await.map_err(super::open_error)?;
    if a.status {
        let (k, json) = (kafka.clone(), a.json);
        return tokio::task::spawn_blocking(move || show_status(&k, index.as_ref(), json)).await?;
    }
    if a.abandon {
        let k = kafka.clone();
        return tokio::task::spawn_blocking(move || {
            // The partition count only names the checkpoints to delete on
            // Elasticsearch: the state's, else the topic's.
            let recorded = index.state().ok().flatten().and_then(|s| s.partitions);
            let partitions = recorded.or_else(|| k.topic_partitions().ok().flatten()).unwrap_or(k.partitions);
            match denorm::rebuild::abandon(index.as_ref(), partitions)? {
                Some(g) => println!("gave up the rebuild of generation {g}: its generation and state are deleted"),
                None => println!("no rebuild in progress: nothing to give up"),
            }
            Ok(())
        })
        .await?;
    }
    let (k, group, keep_old, addr, waits, any_partitioner, accept_gaps, accept_owner_conflicts, change_model) =
        (kafka.clone(), cli.group.clone(), a.keep_old, a.metrics_addr, !a.cross_key.no_takeover_waits, a.cross_key.any_partitioner, a.accept_gaps, a.accept_owner_conflicts, a.change_model);
    let verify = a.verify.then_some(denorm::rebuild::CutoverCheck { force: a.force, wait: Duration::from_secs(a.verify_wait_secs) });
    let handle = denorm::metrics::install().map_err(anyhow::Error::msg).context("installing the metrics recorder")?;
    let health = Arc::new(Health::default());
    health.beat();
    let bound = http::serve(addr, handle, health.clone()).await.with_context(|| format!("binding the metrics endpoint {addr}"))?;
    info!(addr = %bound, "serving /metrics, /healthz, /readyz");
    let dlq = KafkaConfig { topic: denorm::dlq::default_topic(&kafka.topic), ..kafka.clone() };
    let partitions = kafka.topic_partitions()?.ok_or_else(|| UsageError(format!("topic {} does not exist", kafka.topic)))?;
    super::topics::check_lifetime(&kafka, "command topic").await?;
    dlq.ensure_topic().await.context("cannot reach or create the dead-letter topic")?;
    tokio::task::spawn_blocking(move || {
        let r = Rebuild {
            kafka: k,
            index: index.as_ref(),
            group,
            partitions,
            keep_old,
            takeover_waits: waits,
            any_partitioner,
            accept_gaps,
            accept_owner_conflicts,
            verify,
            health,
            runtime: rt,
            members,
            model,
            change_model,
        };
        rebuild(r)
    })
    .await?
}

/// `rebuild --tenant T`: a new revision of one tenant's own indexes.
async fn tenant_rebuild(cli: &Cli, a: &RebuildArgs, tenant: &str, manage: bool) -> anyhow::Result<()> {
    if a.members > 1 {
        return Err(UsageError("--tenant rebuilds with one process (--members 1)".into()).into());
    }
    let kafka = cli.kafka();
    let Some(index) = super::location(cli)?.tenant_generations(&kafka.topic, tenant, (manage, a.to_shared), cli.domain()?).await.map_err(super::open_error)? else {
        return Err(
            UsageError("--tenant rebuilds one tenant's own Elasticsearch indexes: the embedded index keeps every tenant in one placement, and `denorm rebuild` rebuilds them all".into()).into()
        );
    };
    let partitions = kafka.topic_partitions()?.ok_or_else(|| UsageError(format!("topic {} does not exist", kafka.topic)))?;
    if a.abandon {
        return tokio::task::spawn_blocking(move || {
            match denorm::rebuild::tenant::abandon(&index, partitions)? {
                Some(r) => println!("gave up the rebuild of revision {r} of tenant {}'s indexes: it is deleted, and the live workers write the current one", index.tenant),
                None => println!("no rebuild of tenant {} in progress: nothing to give up", index.tenant),
            }
            Ok(())
        })
        .await?;
    }
    let handle = denorm::metrics::install().map_err(anyhow::Error::msg).context("installing the metrics recorder")?;
    let health = Arc::new(Health::default());
    health.beat();
    let bound = http::serve(a.metrics_addr, handle, health.clone()).await.with_context(|| format!("binding the metrics endpoint {}", a.metrics_addr))?;
    info!(addr = %bound, "serving /metrics, /healthz, /readyz");
    super::topics::check_lifetime(&kafka, "command topic").await?;
    let (group, keep_old, takeover_waits, any_partitioner) = (cli.group.clone(), a.keep_old, !a.cross_key.no_takeover_waits, a.cross_key.any_partitioner);
    let runtime = tokio::runtime::Handle::current();
    if index.entering {
        info!(tenant = %index.tenant, "the tenant is in the shared indexes, and DENORM_ES_DEDICATED_TENANTS names it: moving it into indexes of its own");
    } else if index.leaving {
        info!(tenant = %index.tenant, "moving the tenant from its own indexes into the shared ones");
    }
    tokio::task::spawn_blocking(move || {
        let r = denorm::rebuild::tenant::TenantRebuild { kafka, index: &index, group, partitions, keep_old, takeover_waits, any_partitioner, health, runtime };
        let done = with_progress(|shown| denorm::rebuild::tenant::run(r, shown))?;
        let t = &index.tenant;
        let (g, applied, secs) = (done.generation, done.applied, done.elapsed.as_secs_f64());
        let what = if index.entering {
            format!("moved tenant {t} from the shared indexes into indexes of its own as revision {g}")
        } else if index.leaving {
            format!("moved tenant {t} from its own indexes into the shared ones")
        } else {
            format!("rebuilt tenant {t}'s indexes as revision {g}")
        };
        println!("{what} ({applied} of the log's commands read) in {secs:.1}s; its searches and live writes now use it");
        Ok(())
    })
    .await?
}

/// Runs a rebuild with a progress bar on a terminal, a log line every 5 s
/// otherwise; usage errors exit 2.
fn with_progress(run: impl FnOnce(&mut dyn FnMut(&Tick)) -> Result<denorm::rebuild::Done, RebuildError>) -> anyhow::Result<denorm::rebuild::Done> {
    let started = Instant::now();
    let bar = super::progress(0, "rebuild");
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    if !terminal {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut last_report = Instant::now();
    let mut shown = |t: &Tick| {
        bar.set_length(t.of.max(0) as u64);
        bar.set_position(t.applied.max(0) as u64);
        if !terminal && last_report.elapsed() >= Duration::from_secs(5) {
            last_report = Instant::now();
            let rate = t.applied as f64 / started.elapsed().as_secs_f64().max(0.001);
            info!(generation = t.generation, applied = t.applied, of = t.of, rate = rate as u64, "rebuild progress");
        }
    };
    let done = run(&mut shown).map_err(|e| match e {
        e @ (RebuildError::PartitionsAdded { .. }
        | RebuildError::OtherLog { .. }
        | RebuildError::OtherMembers { .. }
        | RebuildError::OwnerConflicts { .. }
        | RebuildError::VerifyOtherLog { .. }
        | RebuildError::TenantOtherLog { .. }
        | RebuildError::TenantDuringRebuild { .. }
        | RebuildError::DuringTenantRebuild { .. }
        | RebuildError::TenantCutOver { .. }
        | RebuildError::ModelChange { .. }
        | RebuildError::UnreadCommands { .. }
        | RebuildError::VerifyModelChange { .. }) => anyhow::Error::new(UsageError(e.to_string())),
        e => anyhow::Error::new(e),
    });
    bar.finish_and_clear();
    done
}

/// Runs the rebuild and prints what it did.
fn rebuild(r: Rebuild<'_>) -> anyhow::Result<()> {
    let done = with_progress(|shown| denorm::rebuild::run(r, shown))?;
    let secs = done.elapsed.as_secs_f64();
    if let Some(v) = &done.verified {
        let o = &v.outcome;
        println!(
            "verified before the cutover: {} document(s) of generation {} compared with the live generation up to offsets {}{}",
            o.checked,
            done.generation,
            denorm::verify::describe(&v.at),
            match o.differences_total {
                0 => ": equal".to_string(),
                n => format!(": {n} differed, cut over anyway (--force)"),
            }
        );
    }
    if let Some(by) = done.cut_over_by {
        println!(
            "built its share of generation {} ({} of the log's commands applied by all members) in {secs:.1}s; member {by} cut over: searches and workers now use it",
            done.generation, done.applied
        );
        return Ok(());
    }
    for (p, low) in &done.skipped {
        println!("skipped offsets 0..{} of partition {p}: retention had deleted them, and the new generation lacks their effects", low - 1);
    }
    println!(
        "rebuilt generation {} from {} partitions: {} commands in {secs:.1}s ({:.0}/s); searches and workers now use it",
        done.generation,
        done.partitions,
        done.applied,
        done.applied as f64 / secs.max(0.001)
    );
    Ok(())
}

fn show_status(kafka: &KafkaConfig, index: &dyn Generations, json: bool) -> anyhow::Result<()> {
    let s = denorm::rebuild::status(kafka, index)?;
    // What each generation holds: a model's name, version and fingerprint,
    // or nothing (the compiled-in kinds alone).
    let mut models = serde_json::Map::new();
    for &g in s.generations.iter().chain(s.rebuild.as_ref().map(|(g, _)| g)) {
        let held = index.model_record(g)?.map(|r| serde_json::json!({"name": r["name"], "version": r["version"], "fingerprint": r["fingerprint"]}));
        models.insert(g.to_string(), held.unwrap_or(serde_json::Value::Null));
    }
    if json {
        let v = serde_json::json!({
            "current": s.current,
            "generations": s.generations,
            "models": models,
            "current_applied": s.current_applied,
            "end": s.end,
            "rebuild": s.rebuild.map(|(g, applied)| serde_json::json!({"generation": g, "applied": applied})),
            "tenant_rebuilds": s.tenant_rebuilds,
        });
        println!("{v}");
        return Ok(());
    }
    println!("current generation: {} ({} of {} commands applied)", s.current, s.current_applied, s.end);
    println!("generations: {:?}", s.generations);
    for (g, held) in &models {
        println!("generation {g} holds {}", denorm::index::recorded_model::named(Some(held).filter(|h| !h.is_null())));
    }
    match s.rebuild {
        Some((g, applied)) => println!("rebuild in progress: generation {g}, {applied} of {} commands applied (run `denorm rebuild` to resume it)", s.end),
        None => println!("no rebuild in progress"),
    }
    for t in &s.tenant_rebuilds {
        println!("rebuild of tenant {t}'s own indexes in progress (run `denorm rebuild --tenant {t}` to resume it, or add --abandon)");
    }
    Ok(())
}
