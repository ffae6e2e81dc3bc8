//! `denorm run`: a worker of the consumer group.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tracing::info;

use super::Cli;
use denorm::apply::FanOut;
use denorm::http::{self, Health};
use denorm::index::embedded::EmbeddedIndex;
use denorm::index::open::{Access, Embedded, Location};
use denorm::worker::{self, defaults, OnAbort, Stats, WorkerConfig};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Address of the /metrics, /healthz and /readyz endpoint (loopback by default)
    #[arg(long, env = "DENORM_METRICS_ADDR", default_value = "127.0.0.1:9464")]
    metrics_addr: SocketAddr,
    /// Tenants with series of their own in the per-tenant metrics (denorm_tenant_*): the first to
    /// send 100 commands, among the busiest; the others' are summed as tenant `_other` (bounded
    /// cardinality; docs/tenants.md)
    #[arg(long, env = "DENORM_METRICS_TENANTS", default_value_t = denorm::metrics::tenants::DEFAULT_LABELED)]
    metrics_tenants: usize,
    /// Most commands applied between two index commits
    #[arg(long, env = "DENORM_MAX_BATCH", default_value_t = defaults::MAX_BATCH)]
    max_batch: usize,
    /// Longest wait of an applied command for its index commit, in milliseconds
    /// (commits are batched: each one creates an index segment)
    #[arg(long, env = "DENORM_COMMIT_LINGER_MS", default_value_t = defaults::COMMIT_LINGER_MS)]
    commit_linger_ms: u64,
    /// Commit a batch as soon as no command has arrived for this many milliseconds (light
    /// traffic is searchable at once; a backlog is still committed in batches)
    #[arg(long, env = "DENORM_COMMIT_QUIET_MS", default_value_t = defaults::COMMIT_QUIET_MS)]
    commit_quiet_ms: u64,
    /// Documents read per page of a fan-out scan (at most 10000 on Elasticsearch, its
    /// index.max_result_window)
    #[arg(long, env = "DENORM_PAGE_SIZE", default_value_t = denorm::apply::DEFAULT_PAGE_SIZE)]
    page_size: usize,
    /// Key lanes per partition: up to this many keys' fan-outs (renames, profile changes) run at
    /// once, a page at a time, and other keys' commands are applied between their pages instead
    /// of waiting; a key's own commands wait behind its fan-out. 1: one command at a time
    #[arg(long, env = "DENORM_LANES", default_value_t = denorm::worker::defaults::LANES)]
    lanes: usize,
    /// Read ahead past a flooding tenant: once a partition's queue holds 1024 messages and one tenant
    /// sent three quarters of its last 256 messages while another was active, that tenant's
    /// messages are held in memory (within --queue-kb), in order, and the other tenants'
    /// messages behind them are applied first; and while another tenant is active, a tenant's
    /// fan-outs take at most every key lane but one (docs/tenants.md). false: strict log order
    #[arg(long, env = "DENORM_TENANT_READ_AHEAD", default_value_t = true, action = clap::ArgAction::Set)]
    tenant_read_ahead: bool,
    /// While --tenant-read-ahead holds a flooding tenant's messages back, a batch holding another
    /// tenant's command is committed at most this many milliseconds after the command joined it
    /// (instead of --commit-linger-ms): the others' commands are searchable sooner, and the
    /// flood's drain takes more, smaller commits [default: 20 on the embedded index; on
    /// Elasticsearch --commit-linger-ms, i.e. off: there each commit is requests to a shared
    /// server, and measured slower]
    #[arg(long, env = "DENORM_TENANT_COMMIT_MS")]
    tenant_commit_ms: Option<u64>,
    /// Where a flooding tenant's messages past what --tenant-read-ahead holds in memory are kept,
    /// in an unnamed file per partition (gone with the process), until they are applied
    /// [default: the system's temporary directory]
    #[arg(long, env = "DENORM_SPILL_DIR")]
    spill_dir: Option<std::path::PathBuf>,
    /// MiB kept in that file per partition at most; past it the flooding tenant's next message
    /// waits, and the partition with it, until the file has room
    #[arg(long, env = "DENORM_SPILL_MB", default_value_t = defaults::SPILL_MB, value_parser = clap::value_parser!(u64).range(1..=(1 << 20)))]
    spill_mb: u64,
    /// Fan-outs in key lanes in this whole process, all partitions: each partition may always run
    /// one; it starts another only while fewer than this many run, and its next fan-out waits
    /// meanwhile. On Elasticsearch each holds a point in time (which keeps the segments it reads
    /// alive) and up to three page bulks in flight
    #[arg(long, env = "DENORM_MAX_LANE_FAN_OUTS", default_value_t = denorm::worker::defaults::MAX_LANE_FAN_OUTS)]
    max_lane_fan_outs: usize,
    /// Pause after each page of a fan-out, in milliseconds, to throttle rewrites
    #[arg(long, env = "DENORM_FAN_OUT_PAGE_PAUSE_MS", default_value_t = 0)]
    fan_out_page_pause_ms: u64,
    /// Embedded index: a fan-out commits its progress after this many rewritten documents, so
    /// what it leaves uncommitted stays bounded (0: only at the end; searches then never see a
    /// rename part-way)
    #[arg(long, env = "DENORM_FAN_OUT_COMMIT_EVERY", default_value_t = denorm::index::embedded::DEFAULT_FAN_OUT_COMMIT_EVERY)]
    fan_out_commit_every: u64,
    /// Embedded index: largest segment merge, in documents. A merge holds memory per document
    /// it merges, so this bounds a shard's merge memory whatever its size; a shard then keeps
    /// at least documents / this many segments (0: tantivy's default, unbounded merges)
    #[arg(long, env = "DENORM_MERGE_MAX_DOCS", default_value_t = denorm::index::embedded::DEFAULT_MERGE_MAX_DOCS)]
    merge_max_docs: u32,
    /// Embedded index: every this many seconds, look for documents that several partitions'
    /// shards hold (an owner change sent without its explicit form); one found in two audits
    /// in a row is logged and counted in denorm_owner_conflicts (0: never). An audit reads
    /// every shard's ids: about 0.1 s per million documents
    #[arg(long, env = "DENORM_OWNER_AUDIT_SECS", default_value_t = 60)]
    owner_audit_secs: u64,
    /// Indexing memory budget per partition shard, in MiB (at least 15)
    #[arg(long, env = "DENORM_INDEX_MEMORY_MB", default_value_t = 64, value_parser = clap::value_parser!(u64).range(15..=4096))]
    index_memory_mb: u64,
    /// KiB of messages queued per partition for its applier; a full queue pauses the
    /// partition until it is down to half
    #[arg(long, env = "DENORM_QUEUE_KB", default_value_t = defaults::QUEUE_KB, value_parser = clap::value_parser!(u64).range(1..=(1 << 30)))]
    queue_kb: u64,
    /// KiB the Kafka client may prefetch for the whole worker (librdkafka's
    /// queued.max.messages.kbytes)
    #[arg(long, env = "DENORM_FETCH_BUFFER_KB", default_value_t = defaults::FETCH_BUFFER_KB, value_parser = clap::value_parser!(u64).range(1..=(1 << 21)))]
    fetch_buffer_kb: u64,
    /// Longest wait, in seconds, for the command in progress when stopping or
    /// giving partitions up; past it the command is left to the next owner
    #[arg(long, env = "DENORM_SHUTDOWN_TIMEOUT_SECS", default_value_t = defaults::SHUTDOWN_TIMEOUT_SECS)]
    shutdown_timeout_secs: u64,
    /// Longest time, in seconds, from a stop (SIGTERM) to the exit: draining
    /// (at most --shutdown-timeout-secs), the last offset commit and leaving
    /// the group. A broker that does not answer by then is given up on; what
    /// was not committed is replayed, harmlessly, by the next owner. Keep it
    /// below the pod's termination grace
    #[arg(long, env = "DENORM_SHUTDOWN_GRACE_SECS", default_value_t = defaults::SHUTDOWN_GRACE_SECS)]
    shutdown_grace_secs: u64,
    /// Largest message payload accepted, in bytes; larger ones are rejected
    #[arg(long, env = "DENORM_MAX_MESSAGE_BYTES", default_value_t = defaults::MAX_MESSAGE_BYTES)]
    max_message_bytes: usize,
    /// Least time between two offset commits to Kafka, in milliseconds: durable progress is
    /// committed as soon as this allows (read-your-writes waits for it)
    #[arg(long, env = "DENORM_COMMIT_INTERVAL_MS", default_value_t = defaults::COMMIT_INTERVAL_MS)]
    commit_interval_ms: u64,
    /// Dead-letter topic for aborted and parked commands [default: <topic>.dlq]
    #[arg(long, env = "DENORM_DLQ_TOPIC")]
    pub dlq_topic: Option<String>,
    /// After a command is aborted, `park` dead-letters its key's later
    /// commands until `denorm dlq reprocess` or `clear` (order kept); `skip`
    /// applies them anyway (availability over order)
    #[arg(long, env = "DENORM_ON_ABORT", default_value = "park", value_parser = on_abort_parser())]
    on_abort: OnAbort,
    /// Attempts at a command the index rejects before it is aborted
    /// (transient failures such as an unreachable index are retried without limit)
    #[arg(long, env = "DENORM_MAX_ATTEMPTS", default_value_t = defaults::MAX_ATTEMPTS, value_parser = clap::value_parser!(u32).range(1..=1000))]
    max_attempts: u32,
    /// Longest wait between retries of a transient failure, in milliseconds
    #[arg(long, env = "DENORM_RETRY_BACKOFF_MAX_MS", default_value_t = defaults::RETRY_BACKOFF_MAX_MS, value_parser = clap::value_parser!(u64).range(50..))]
    retry_backoff_max_ms: u64,
    /// Static group membership: this worker's stable identity in the group (librdkafka's
    /// group.instance.id), such as a StatefulSet pod's name. Restarted with the same id within
    /// --session-timeout-ms, it takes its partitions back without a rebalance; stopped, it
    /// keeps them, unconsumed, until the session timeout expires. Unique per worker
    #[arg(long, env = "DENORM_INSTANCE_ID", value_parser = parse_instance_id)]
    instance_id: Option<String>,
    /// How long the group waits for a silent worker before giving its partitions to others, in
    /// milliseconds (librdkafka's session.timeout.ms; brokers accept 6000-1800000 by default).
    /// With --instance-id it is also how long a restart may take without a rebalance
    #[arg(long, env = "DENORM_SESSION_TIMEOUT_MS", default_value_t = defaults::SESSION_TIMEOUT_MS, value_parser = clap::value_parser!(u32).range(1000..=3_600_000))]
    session_timeout_ms: u32,
    /// The longest a message waits on another partition or on the rest of a cross-key move, in
    /// seconds: an owner change's upsert or a move's first chunk waiting for the partition its
    /// documents leave, a move spanning several messages waiting for its next chunk. Past it the
    /// message is dead-lettered (reason takeover_timeout or move_incomplete) and its key parked;
    /// the partition's other keys go on
    #[arg(long, env = "DENORM_WAIT_LIMIT_SECS", default_value_t = defaults::WAIT_LIMIT_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    wait_limit_secs: u64,
    /// Keys a partition parks at most: parked keys are kept in every checkpoint, and any producer
    /// can make them. A command aborted past it is dead-lettered without parking its key, whose
    /// later commands are then applied (counted by denorm_parking_refused_total)
    #[arg(long, env = "DENORM_MAX_PARKED_KEYS", default_value_t = defaults::MAX_PARKED_KEYS)]
    max_parked_keys: usize,
    /// Seconds a partition's fetch position may stay below the broker's end while nothing waits
    /// for its applier before the partition is reported stalled: degraded in /readyz and
    /// denorm_partition_fetch_stalled, with an error naming the offset (a batch the consumer
    /// cannot fetch or decode is fetched again for ever, and librdkafka's error names no partition)
    #[arg(long, env = "DENORM_FETCH_STALL_SECS", default_value_t = defaults::FETCH_STALL_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    fetch_stall_secs: u64,
    #[command(flatten)]
    pub cross_key: super::CrossKeyArgs,
    #[command(flatten)]
    registry: super::RegistryArgs,
}

/// `--on-abort`'s values, with their help, from the library's [`OnAbort`].
fn on_abort_parser() -> impl clap::builder::TypedValueParser<Value = OnAbort> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(OnAbort::ALL.map(|p| PossibleValue::new(p.name()).help(p.summary()))).map(|s| s.parse::<OnAbort>().expect("one of the possible values"))
}

/// Kafka's rule for a group.instance.id: 1-249 of `[a-zA-Z0-9._-]`.
fn parse_instance_id(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 249 || !s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
        return Err(format!("{s:?}: an instance id is 1 to 249 letters, digits, '.', '_' or '-'"));
    }
    Ok(s.to_string())
}

pub async fn run(cli: &Cli, a: &RunArgs) -> anyhow::Result<()> {
    let window = denorm::index::elastic::search::MAX_RESULT_WINDOW;
    let elastic = Location::names_elastic(&cli.index);
    if elastic && a.page_size > window {
        // Every page of every fan-out would be refused (from + size above
        // index.max_result_window): every rename would fail for good.
        return Err(
            super::UsageError(format!("--page-size {} is above Elasticsearch's index.max_result_window ({window}): a page of a fan-out may hold at most {window} documents", a.page_size)).into()
        );
    }
    if elastic {
        denorm::index::elastic::docs::check_page_pause(Duration::from_millis(a.fan_out_page_pause_ms)).map_err(super::UsageError)?;
    }
    // Signal handlers first: a SIGTERM during start-up stops the worker
    // cleanly too, instead of killing the process.
    use tokio::signal::unix::{signal, SignalKind};
    let shutdown = Arc::new(AtomicBool::new(false));
    let (mut term, mut int) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
    let flag = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => info!("SIGINT received"),
            _ = term.recv() => info!("SIGTERM received"),
        }
        flag.store(true, Ordering::SeqCst);
    });
    let handle = denorm::metrics::install().map_err(anyhow::Error::msg).context("installing the metrics recorder")?;
    denorm::metrics::tenants::set_labeled(a.metrics_tenants);
    let health = Arc::new(Health::default());
    health.beat();
    let bound = http::serve(a.metrics_addr, handle, health.clone()).await.with_context(|| format!("binding the metrics endpoint {}", a.metrics_addr))?;
    info!(addr = %bound, "serving /metrics, /healthz, /readyz");

    let registry = a.registry.registry()?;
    if let Some(r) = &registry {
        info!(url = %r.url(), "schema-registry framing accepted");
    }
    let kafka = cli.kafka();
    let (partitions, dlq) = super::topics::ensure(&kafka, a.dlq_topic.as_deref()).await?;
    info!(topic = %kafka.topic, partitions, dead_letters = %dlq.topic, "topics ready");
    let location = super::location(cli)?;
    let model = cli.domain()?;
    if let Some(d) = model {
        info!(model = %d.name, version = d.version, fingerprint = %d.fingerprint(), "applying the model's commands beside the compiled-in ones");
    }
    let tuning = Embedded { memory: (a.index_memory_mb as usize) << 20, fan_out_commit_every: Some(a.fan_out_commit_every), merge_max_docs: Some(a.merge_max_docs), model };
    let backend = location.backend(&kafka.topic, Access::Apply, tuning).await.map_err(super::open_error)?;
    if let (Location::Embedded(dir), true) = (&location, a.owner_audit_secs > 0) {
        let (audited, flag) = (EmbeddedIndex::open_existing(dir)?, shutdown.clone());
        let every = Duration::from_secs(a.owner_audit_secs);
        std::thread::Builder::new().name("owner-audit".into()).spawn(move || denorm::index::embedded::audit_owners(&audited, every, &flag))?;
    }
    let mut cfg = WorkerConfig::new(kafka, cli.group.clone());
    cfg.max_batch = a.max_batch;
    cfg.commit_linger = Duration::from_millis(a.commit_linger_ms);
    cfg.commit_quiet = Duration::from_millis(a.commit_quiet_ms);
    cfg.queue_bytes = (a.queue_kb as usize) << 10;
    cfg.fetch_buffer_kb = a.fetch_buffer_kb as usize;
    cfg.shutdown_timeout = Duration::from_secs(a.shutdown_timeout_secs);
    cfg.shutdown_grace = Duration::from_secs(a.shutdown_grace_secs);
    cfg.max_message_bytes = a.max_message_bytes;
    cfg.lanes = a.lanes;
    cfg.tenant_read_ahead = a.tenant_read_ahead;
    cfg.tenant_commit = a.tenant_commit_ms.map(Duration::from_millis);
    if let Some(dir) = &a.spill_dir {
        cfg.spill_dir = dir.clone();
    }
    cfg.spill_bytes = a.spill_mb << 20;
    cfg.max_lane_fan_outs = a.max_lane_fan_outs;
    cfg.fan_out = FanOut { page_size: a.page_size, page_pause: Duration::from_millis(a.fan_out_page_pause_ms) };
    cfg.commit_interval = Duration::from_millis(a.commit_interval_ms);
    cfg.dlq_topic = dlq.topic;
    cfg.on_abort = a.on_abort;
    cfg.max_attempts = a.max_attempts;
    cfg.retry_backoff_max = Duration::from_millis(a.retry_backoff_max_ms);
    cfg.registry = registry;
    cfg.model = model;
    cfg.instance_id = a.instance_id.clone();
    cfg.session_timeout = Duration::from_millis(a.session_timeout_ms.into());
    cfg.takeover_waits = !a.cross_key.no_takeover_waits;
    cfg.wait_limit = Duration::from_secs(a.wait_limit_secs);
    cfg.max_parked_keys = a.max_parked_keys;
    cfg.fetch_stall_after = Duration::from_secs(a.fetch_stall_secs);
    cfg.any_partitioner = a.cross_key.any_partitioner;
    if let Some(id) = &cfg.instance_id {
        // What the consumer will use: an -X session.timeout.ms wins over the flag.
        let session = cfg.kafka.options.iter().rev().find(|(k, _)| k == "session.timeout.ms").map_or_else(|| a.session_timeout_ms.to_string(), |(_, v)| v.clone());
        info!(instance_id = %id, session_timeout_ms = %session, "static group membership");
    }

    let stats = Arc::new(Stats::default());
    tokio::task::spawn_blocking(move || {
        worker::settings::announce(backend.as_ref(), &cfg).map_err(worker::WorkerError::Index)?;
        worker::run(cfg, backend, shutdown, health, stats)
    })
    .await?
    .context("worker failed")?;
    Ok(())
}
