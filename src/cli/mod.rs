//! Command-line interface: one module per subcommand. Builds library types;
//! no business logic here. Every flag has a `DENORM_*` environment variable.

mod bench;
mod demo;
mod dlq;
mod generate;
mod lag;
mod migrate;
mod model;
mod produce;
mod rebuild;
mod run;
mod schema;
mod search;
mod tenant;
mod topics;
mod verify;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use denorm::index::open::{Location, OpenError};
use denorm::kafka::KafkaConfig;

/// denorm: keeps denormalized search documents right, driven by a Kafka log
/// of commands.
///
/// Producers send commands (upsert/delete files, users and posts, rename a
/// path) to a partitioned topic keyed by top-level directory or user id;
/// `denorm run` workers apply them in per-key order to the index, fanning
/// renames out to every affected document. Start with `denorm demo`.
#[derive(Debug, Parser)]
#[command(name = "denorm", version, propagate_version = true, after_long_help = environment_help())]
pub struct Cli {
    /// Kafka bootstrap servers (host:port,...)
    #[arg(long, global = true, help_heading = "Global options", env = "DENORM_BROKERS", default_value = "localhost:9092")]
    pub brokers: String,
    /// Topic holding the commands
    #[arg(long, global = true, help_heading = "Global options", env = "DENORM_TOPIC", default_value = "denorm.commands")]
    pub topic: String,
    /// Consumer group of the workers
    #[arg(long, global = true, help_heading = "Global options", env = "DENORM_GROUP", default_value = "denorm")]
    pub group: String,
    /// Embedded index directory, or an Elasticsearch URL (http[s]://host:9200; credentials from DENORM_ES_*)
    #[arg(long, global = true, help_heading = "Global options", env = "DENORM_INDEX", default_value = "./data/index")]
    pub index: PathBuf,
    /// Partitions of the topic when denorm creates it (by `produce` and `run`)
    #[arg(long, global = true, help_heading = "Global options", env = "DENORM_PARTITIONS", default_value_t = 12, value_parser = clap::value_parser!(i32).range(1..=10000))]
    pub partitions: i32,
    /// Replication factor of the topic when denorm creates it
    #[arg(long, global = true, help_heading = "Global options", env = "DENORM_REPLICATION_FACTOR", default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=32))]
    pub replication_factor: i32,
    /// Extra librdkafka option KEY=VALUE for every Kafka client (repeatable; TLS and SASL
    /// settings go here; values may contain commas; in the environment, separate options with `;`)
    #[arg(long = "kafka-option", short = 'X', global = true, help_heading = "Global options", hide_env_values = true, env = "DENORM_KAFKA_OPTIONS", value_delimiter = ';', value_parser = parse_kv)]
    pub kafka_options: Vec<(String, String)>,
    /// File of librdkafka options, one KEY=VALUE per line (`#` comments): for secrets such as
    /// sasl.password, mounted from a Kubernetes Secret. Applied before the --kafka-option ones
    #[arg(long, global = true, help_heading = "Global options", env = "DENORM_KAFKA_OPTIONS_FILE", value_name = "PATH", value_parser = parse_options_file)]
    pub kafka_options_file: Option<OptionsFile>,
    /// File of keys that sign denorm's own messages (move chunks, REPLAY/DISCARD/RESOLVE/PLACE), one
    /// per line, at least 32 bytes each: the first signs, every one verifies. With it, workers
    /// dead-letter such messages without a valid signature (reason `forged`); mount it from a Secret
    /// that producers do not have. Every worker, `dlq`, `rebuild`, `verify` and `migrate` of a
    /// topic needs the same file
    #[arg(long, global = true, help_heading = "Global options", env = "DENORM_SIGNING_KEY_FILE", value_name = "PATH", value_parser = parse_signing_file)]
    pub signing_key_file: Option<SigningFile>,
    /// A model file (docs/model.md): its kinds' commands are produced, applied and searched beside
    /// the compiled-in ones, and the index records it (a worker with another is refused). On
    /// Elasticsearch, each of its kinds is an index of its own
    #[arg(long, global = true, help_heading = "Global options", env = "DENORM_MODEL", value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Log filter (tracing syntax, e.g. `info` or `denorm=debug`)
    #[arg(long, global = true, help_heading = "Global options", env = "DENORM_LOG")]
    pub log: Option<String>,
    #[command(subcommand)]
    pub command: Commands,
}

#[derive(Debug, Subcommand)]
pub enum Commands {
    /// Run the main job on embedded defaults: in-process broker, embedded index, sample data, model check
    Demo(demo::DemoArgs),
    /// Send commands to the topic (one from flags, or many from JSONL)
    Produce(produce::ProduceArgs),
    /// Run a worker: apply commands from the topic to the index
    Run(run::RunArgs),
    /// Search the index (embedded or Elasticsearch)
    Search(search::SearchArgs),
    /// Show the consumer group's lag per partition
    Lag(lag::LagArgs),
    /// Print the demo's data set as JSONL (pipe it into `denorm produce --jsonl -`)
    Generate(generate::GenerateArgs),
    /// Dead letters: count, list, reprocess or clear aborted and parked commands
    Dlq(dlq::DlqArgs),
    /// Measure throughput, fan-out memory and latency against raw baselines (a plain
    /// consumer, bare tantivy) on a running broker; `scripts/bench.sh` starts one
    Bench(bench::BenchArgs),
    /// Rebuild the index (embedded or Elasticsearch) from the whole topic into a new
    /// generation while the live workers and searches keep using the current one, then
    /// cut over atomically (resumable; --status shows the state)
    Rebuild(rebuild::RebuildArgs),
    /// Copy the topic into a new one with another partition count, keeping every key's
    /// order (pause the producers first); then rebuild from it
    Migrate(migrate::MigrateArgs),
    /// Create the topic (with --partitions) and its dead-letter topic when missing, as
    /// `run` does at start; for a deployment's pre-install step
    Topics(topics::TopicsArgs),
    /// Prove that the index equals its log: replay the topic up to the index's checkpoints
    /// into a scratch copy and compare them document by document, while the workers run.
    /// Exit status 0: equal; 1: differences (listed); 2: could not verify
    Verify(verify::VerifyArgs),
    /// One tenant's operations (docs/tenants.md): its filtered read aliases on Elasticsearch
    Tenant(tenant::TenantArgs),
    /// Model files (docs/model.md): check one and show what it declares
    Model(model::ModelArgs),
    /// Print the Avro schema of the commands, the compiled-in domain's or a model's
    /// (--model): for a schema registry, or a producer in any language
    Schema(schema::SchemaArgs),
}

/// The variables read besides the flags' own (`[env: ...]`): credentials
/// and certificates, each secret also from a file (`_FILE`).
fn environment_help() -> String {
    use denorm::codec::registry::env as sr;
    use denorm::index::elastic::config::env as es;
    let rows: [(&[&str], &str); 9] = [
        (&[es::USERNAME, es::USERNAME_FILE, es::PASSWORD, es::PASSWORD_FILE], "Elasticsearch basic authentication"),
        (&[es::API_KEY_ID, es::API_KEY, es::API_KEY_FILE], "Elasticsearch API key, as an id and a key"),
        (&[es::API_KEY_ENCODED, es::API_KEY_ENCODED_FILE], "Elasticsearch API key, as the base64 `encoded` value"),
        (&[es::CA_CERT], "PEM file of a CA certificate Elasticsearch's TLS certificate is checked against"),
        (&[es::PREFIX], "Prefix of the Elasticsearch aliases and indexes (default: denorm)"),
        (&[es::META_SHARDS], "Primary shards of the Elasticsearch meta index when it is created (1 to 64, default: 1)"),
        (&[es::DEDICATED_TENANTS], "Tenants (comma-separated) given Elasticsearch indexes of their own in a generation created from now on: the first start, or `denorm rebuild`, which moves tenants between placements (docs/tenants.md)"),
        (&[sr::USERNAME, sr::PASSWORD, sr::PASSWORD_FILE], "Schema registry basic authentication"),
        (&[sr::CA_CERT], "PEM file of a CA certificate for the schema registry"),
    ];
    let mut out = String::from("Environment (besides each flag's own variable):\n");
    for (names, what) in rows {
        out.push_str(&format!("  {}\n          {what}\n", names.join(", ")));
    }
    out
}

/// A tenant id as a flag's value (`--tenant`): refused by clap, exit 2,
/// when it is not one (docs/tenants.md).
pub(crate) fn parse_tenant(s: &str) -> Result<String, String> {
    denorm::command::tenant::validate(s).map(|()| s.to_string()).map_err(|e| e.to_string())
}

/// A `KEY=VALUE` option. One without a key is kept with an empty key and
/// refused by [`Cli::check_options`], not here: clap would echo it, and it
/// may be the tail of a secret cut at a `;` (the separator of
/// DENORM_KAFKA_OPTIONS).
fn parse_kv(s: &str) -> Result<(String, String), String> {
    Ok(match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => (k.trim().to_string(), v.to_string()),
        _ => (String::new(), s.to_string()),
    })
}

impl Cli {
    /// Refuses a `--kafka-option` without a key, without showing it.
    pub fn check_options(&self) -> Result<(), UsageError> {
        match self.kafka_options.iter().find(|(k, _)| k.is_empty()) {
            Some((_, v)) => Err(UsageError(format!(
                "--kafka-option (or DENORM_KAFKA_OPTIONS): expected KEY=VALUE, got {} bytes without a key, not shown: if an option's value holds a ';', which separates options, put the option in --kafka-options-file",
                v.len()
            ))),
            None => Ok(()),
        }
    }
}

/// librdkafka options read from a file; its Debug form shows the keys only.
#[derive(Clone)]
pub struct OptionsFile {
    pub path: PathBuf,
    pub options: Vec<(String, String)>,
}

impl std::fmt::Debug for OptionsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OptionsFile").field("path", &self.path).field("keys", &self.options.iter().map(|(k, _)| k).collect::<Vec<_>>()).finish()
    }
}

/// Signing keys read from a file; its Debug form shows how many.
#[derive(Clone, Debug)]
pub struct SigningFile {
    pub keys: std::sync::Arc<denorm::signing::Signing>,
}

fn parse_signing_file(path: &str) -> Result<SigningFile, String> {
    denorm::signing::Signing::read(std::path::Path::new(path)).map(|k| SigningFile { keys: std::sync::Arc::new(k) })
}

fn parse_options_file(path: &str) -> Result<OptionsFile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    options_from_text(&text).map(|options| OptionsFile { path: path.into(), options }).map_err(|e| format!("{path}: {e}"))
}

/// `KEY=VALUE` lines; blank lines and `#` comments are skipped. An error
/// names the line, never its value (the file holds secrets).
pub fn options_from_text(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        match line.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => out.push((k.trim().to_string(), v.to_string())),
            _ => return Err(format!("line {}: expected KEY=VALUE", i + 1)),
        }
    }
    Ok(out)
}

impl Cli {
    /// The model of `--model`, read and checked (`None`: the compiled-in
    /// kinds only).
    pub fn domain(&self) -> Result<Option<&'static denorm::domain::Domain>, UsageError> {
        let Some(path) = &self.model else { return Ok(None) };
        let d = denorm::domain::Domain::load(path).map_err(|e| UsageError(e.to_string()))?;
        Ok(Some(d.interned()))
    }

    pub fn kafka(&self) -> KafkaConfig {
        let mut options = self.kafka_options_file.as_ref().map(|f| f.options.clone()).unwrap_or_default();
        options.extend(self.kafka_options.iter().cloned());
        KafkaConfig {
            brokers: self.brokers.clone(),
            topic: self.topic.clone(),
            partitions: self.partitions,
            replication: self.replication_factor,
            options,
            signing: self.signing_key_file.as_ref().map(|f| f.keys.clone()),
        }
    }
}

/// Invalid input: exits with status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.downcast_ref::<UsageError>().is_some() || e.downcast_ref::<verify::CouldNotVerify>().is_some() {
        2
    } else {
        1
    }
}

pub fn init_tracing(cli: &Cli) {
    // rust-rdkafka's consumer closes itself again when dropped, and logs an
    // error when it was closed already: the worker closes its consumer
    // itself, with a deadline (worker::leave), so that message says nothing.
    let default = match cli.command {
        Commands::Run(_) | Commands::Rebuild(_) => "info,tantivy=warn,rdkafka::consumer::base_consumer=off",
        _ => "warn,rdkafka::consumer::base_consumer=off",
    };
    let filter = cli.log.clone().or_else(|| std::env::var("RUST_LOG").ok()).unwrap_or_else(|| default.to_string());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none())
        .try_init();
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    cli.check_options()?;
    match &cli.command {
        Commands::Demo(a) => demo::run(&cli, a).await,
        Commands::Produce(a) => produce::run(&cli, a).await,
        Commands::Run(a) => run::run(&cli, a).await,
        Commands::Search(_) => {
            let handle = tokio::runtime::Handle::current();
            tokio::task::spawn_blocking(move || {
                let Commands::Search(a) = &cli.command else { unreachable!() };
                search::run(&cli, a, handle)
            })
            .await?
        }
        Commands::Lag(a) => lag::run(&cli, a).await,
        Commands::Generate(a) => generate::run(a),
        Commands::Dlq(a) => dlq::run(&cli, a).await,
        Commands::Bench(a) => bench::run(&cli, a).await,
        Commands::Rebuild(a) => rebuild::run(&cli, a).await,
        Commands::Migrate(a) => migrate::run(&cli, a).await,
        Commands::Topics(a) => topics::run(&cli, a).await,
        Commands::Verify(a) => verify::run(&cli, a).await,
        Commands::Tenant(a) => tenant::run(&cli, a).await,
        Commands::Model(a) => model::run(a),
        Commands::Schema(a) => schema::run(&cli, a),
    }
}

/// The index `--index` names (see [`denorm::index::open`]). Settings that
/// are not usable as given exit 2.
pub(crate) fn location(cli: &Cli) -> anyhow::Result<Location> {
    Location::parse(&cli.index).map_err(open_error)
}

/// An index that could not be opened: bad settings exit 2, like a bad flag.
pub(crate) fn open_error(e: OpenError) -> anyhow::Error {
    match e {
        OpenError::Settings(s) => UsageError(s).into(),
        e => e.into(),
    }
}

/// How the topic places keys and orders what crosses them (`run`,
/// `rebuild`).
#[derive(Debug, Clone, clap::Args)]
pub struct CrossKeyArgs {
    /// Accept messages in any partition, for a topic written with another partitioner than
    /// murmur2 (the Java client's, and denorm's): renames across top-level directories are then
    /// refused (their files would go to the murmur2 partition, which the destination's own
    /// commands never reach). Without it, a message whose key does not hash to its partition is
    /// dead-lettered (reason wrong_partition). See docs/producers.md
    #[arg(long, env = "DENORM_ANY_PARTITIONER")]
    pub any_partitioner: bool,
    /// Apply a take-over (a cross-key move's documents, an owner change's upsert) without
    /// waiting until the partition its document leaves is applied up to the departure. Only
    /// for a topic whose messages name positions of another topic (copied by other means than
    /// `denorm migrate`, which rewrites them); on Elasticsearch, a replay of a document that
    /// changed hands more than once may then lose it (see docs/cross-key.md)
    #[arg(long, env = "DENORM_NO_TAKEOVER_WAITS")]
    pub no_takeover_waits: bool,
}

/// Schema-registry options shared by `run` and `produce`.
#[derive(Debug, Clone, clap::Args)]
pub struct RegistryArgs {
    /// Confluent Schema Registry URL. `run` then also accepts messages in its framing (magic
    /// byte 0 + schema id); `produce` writes that framing, registering schemas/command.avsc or,
    /// with --model, the model's schema under the subject. Credentials from
    /// DENORM_SCHEMA_REGISTRY_USERNAME and _PASSWORD (or _PASSWORD_FILE); a CA certificate
    /// from DENORM_SCHEMA_REGISTRY_CA_CERT
    #[arg(long = "schema-registry", value_name = "URL", env = "DENORM_SCHEMA_REGISTRY_URL")]
    pub schema_registry: Option<String>,
}

impl RegistryArgs {
    /// The registry client, when a URL is given.
    pub fn registry(&self) -> anyhow::Result<Option<std::sync::Arc<denorm::codec::registry::Registry>>> {
        let Some(url) = &self.schema_registry else { return Ok(None) };
        let cfg = denorm::codec::registry::RegistryConfig::from_env(url).map_err(|e| UsageError(e.to_string()))?;
        Ok(Some(std::sync::Arc::new(denorm::codec::registry::Registry::new(cfg).map_err(|e| UsageError(e.to_string()))?)))
    }
}

/// The sample data set's size and seed (`denorm demo`, `denorm generate`).
#[derive(Debug, Clone, clap::Args)]
pub struct DataSetArgs {
    /// Files in the data set
    #[arg(long, default_value_t = 50_000)]
    pub files: usize,
    /// Users in the data set
    #[arg(long, default_value_t = 1_000)]
    pub users: usize,
    /// Posts in the data set
    #[arg(long, default_value_t = 10_000)]
    pub posts: usize,
    /// Users renamed in the race that follows the load
    #[arg(long, default_value_t = 20)]
    pub renamed_users: usize,
    /// Seed of the data generator
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

impl DataSetArgs {
    /// The load: files, users, posts.
    pub fn load(&self) -> Vec<denorm::command::Command> {
        denorm::demo::seed(self.files, self.users, self.posts, self.seed)
    }
    /// The user renames of the race.
    pub fn user_renames(&self) -> Vec<denorm::command::Command> {
        denorm::demo::user_renames(self.renamed_users.min(self.users), self.seed)
    }
}

/// A progress bar on stderr, hidden when stderr is not a terminal.
pub(crate) fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(indicatif::ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len} ({per_sec}, eta {eta})").expect("template").progress_chars("=> "));
    bar.set_message(what.to_string());
    bar
}
