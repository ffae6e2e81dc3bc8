//! `denorm produce`: one command from flags, or many from JSONL.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::{Cli, UsageError};
use denorm::command::generic::bound::Bound;
use denorm::command::{jsonl, Command};
use denorm::domain::Domain;
use denorm::produce::Producer;

#[derive(Debug, Args)]
pub struct ProduceArgs {
    /// JSONL file of commands, one per line (`-` for stdin). The whole input
    /// is validated before anything is sent.
    #[arg(long, value_name = "FILE")]
    jsonl: Option<PathBuf>,
    /// The tenant every command belongs to (a-z, 0-9, '_' and '-', at most
    /// 64 bytes; see docs/tenants.md). Without it, a command belongs to the
    /// default tenant, or to the tenant its JSONL line names ("tenant")
    #[arg(long, global = true, value_name = "TENANT", env = "DENORM_TENANT", value_parser = super::parse_tenant)]
    tenant: Option<String>,
    /// After sending, wait until the consumer group (--group) has applied the
    /// commands: read-your-writes (for a rename across top-level
    /// directories, on both sides). The whole call gives up after this many
    /// seconds (60 when none is given), saying which stage and which
    /// partitions were behind. Without it, each rename across top-level
    /// directories may take 60 s to be applied at its source before what
    /// follows it is sent. Before a command's name it needs its seconds
    /// (`--wait 60 rename ...`); after the command's flags it may stand alone
    #[arg(long, global = true, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "60")]
    wait: Option<u64>,
    /// Most commands awaiting acknowledgement at once
    #[arg(long, env = "DENORM_IN_FLIGHT", default_value_t = 10_000)]
    in_flight: usize,
    #[command(flatten)]
    registry: super::RegistryArgs,
    /// Registry subject of the command schema [default: <topic>-value, TopicNameStrategy]
    #[arg(long, value_name = "SUBJECT", env = "DENORM_SCHEMA_REGISTRY_SUBJECT", requires = "schema_registry")]
    subject: Option<String>,
    /// Only look the schema up in the registry; fail if it is not registered
    /// (like Confluent's auto.register.schemas=false)
    #[arg(long, requires = "schema_registry")]
    no_register_schema: bool,
    #[command(subcommand)]
    command: Option<One>,
}

/// One command from flags.
#[derive(Debug, Clone, Subcommand)]
enum One {
    /// Create or replace a file document
    UpsertFile {
        #[arg(long)]
        id: String,
        /// Full path including the file name, e.g. /clinton/projects/README.txt
        #[arg(long)]
        path: String,
        #[arg(long, default_value = "")]
        contents: String,
        /// The file's current path, when it moves to another top-level
        /// directory with this upsert (an owner change): the file is deleted
        /// there first, and the upsert is sent once the group applied the
        /// delete
        #[arg(long, value_name = "PATH")]
        previous_path: Option<String>,
    },
    /// Delete a file document
    DeleteFile {
        #[arg(long)]
        id: String,
        #[arg(long)]
        path: String,
    },
    /// Rename a file or a directory (every file beneath it). Across
    /// top-level directories (`/clinton` -> `/bill`, `/clinton/a` ->
    /// `/bill/a`) the documents move between ordering keys; the command is
    /// acknowledged once the worker group (--group) has applied it at its
    /// source, so a worker must be running
    Rename {
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: String,
    },
    /// Create or change a user; a new name is copied into all their posts
    UpsertUser {
        #[arg(long)]
        id: String,
        #[arg(long)]
        name: String,
        #[arg(long, default_value = "")]
        email: String,
        /// Date of birth, YYYY-MM-DD
        #[arg(long)]
        dob: String,
    },
    /// Create or replace a post (the author's current name is copied in)
    UpsertPost {
        #[arg(long)]
        id: String,
        #[arg(long)]
        user_id: String,
        #[arg(long, default_value = "")]
        title: String,
        #[arg(long, default_value = "")]
        body: String,
        /// The user the post belongs to now, when this upsert gives it to
        /// --user-id (an owner change): the post is deleted under that user
        /// first, and the upsert is sent once the group applied the delete
        #[arg(long, value_name = "USER_ID")]
        previous_user_id: Option<String>,
    },
    /// Delete a post
    DeletePost {
        #[arg(long)]
        id: String,
        #[arg(long)]
        user_id: String,
    },
    /// Delete a user's profile (their posts stay: delete those first)
    DeleteUser {
        #[arg(long)]
        id: String,
    },
}

impl One {
    /// The validated command.
    fn command(self) -> Result<Command, denorm::command::CommandError> {
        let one = match self {
            One::UpsertFile { id, path, contents, previous_path } => Command::UpsertFile { id, path, contents, previous_path },
            One::DeleteFile { id, path } => Command::DeleteFile { id, path },
            One::Rename { from, to } => Command::RenamePath { from, to },
            One::UpsertUser { id, name, email, dob } => Command::UpsertUser { id, name, email, dob },
            One::UpsertPost { id, user_id, title, body, previous_user_id } => Command::UpsertPost { id, user_id, title, body, previous_user_id },
            One::DeletePost { id, user_id } => Command::DeletePost { id, user_id },
            One::DeleteUser { id } => Command::DeleteUser { id },
        };
        one.validate()?;
        Ok(one)
    }
}

/// The commands scoped to `tenant`, when given: a command of another
/// tenant (its JSONL line names one) is a usage error.
fn in_tenant(commands: Vec<Command>, tenant: Option<&str>) -> Result<Vec<Command>, UsageError> {
    let Some(t) = tenant else { return Ok(commands) };
    commands
        .into_iter()
        .enumerate()
        .map(|(i, c)| match c.tenant() {
            None => Ok(c.scoped(Some(t))),
            Some(x) if x == t => Ok(c),
            Some(x) => Err(UsageError(format!("command {} names tenant {x:?}, but --tenant is {t:?} (nothing was sent)", i + 1))),
        })
        .collect()
}

/// Reads and validates a JSONL input: every line, before anything is sent.
/// With `model`, its commands (docs/model.md, "JSONL").
fn read_jsonl(path: &PathBuf, model: Option<&'static Domain>) -> anyhow::Result<Vec<Command>> {
    let input: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let f = std::fs::File::open(path).map_err(|e| UsageError(format!("cannot open {}: {e}", path.display())))?;
        Box::new(std::io::BufReader::new(f))
    };
    let refused = |e: &dyn std::fmt::Display| UsageError(format!("{}: {e} (nothing was sent)", path.display()));
    match model {
        None => jsonl::parse_all(input).map_err(|e| refused(&e).into()),
        Some(d) => {
            let commands = denorm::command::generic::jsonl::parse_all(d, input).map_err(|e| refused(&e))?;
            Ok(commands.into_iter().map(|e| Command::Model(Box::new(Bound::new(d, e.tenant, e.command)))).collect())
        }
    }
}

pub async fn run(cli: &Cli, a: &ProduceArgs) -> anyhow::Result<()> {
    let model = cli.domain()?;
    let commands = match (&a.jsonl, &a.command) {
        (Some(_), Some(_)) => return Err(UsageError("give either --jsonl FILE or one command, not both".into()).into()),
        (Some(path), None) => read_jsonl(path, model)?,
        (None, Some(_)) if model.is_some() => {
            return Err(UsageError("--model: a model's commands are read from --jsonl FILE (docs/model.md, \"JSONL\"); the one-command form is the compiled-in kinds'".into()).into())
        }
        (None, Some(one)) => vec![one.clone().command().map_err(|e| UsageError(format!("invalid command: {e}")))?],
        (None, None) => return Err(UsageError("give a command (see `denorm produce --help`) or --jsonl FILE".into()).into()),
    };
    let commands = in_tenant(commands, a.tenant.as_deref())?;
    let kafka = cli.kafka();
    kafka.ensure_topic().await.context("cannot reach or create the topic")?;
    let producer = match model {
        Some(d) => Producer::new(&kafka)?.with_model(d),
        None => Producer::new(&kafka)?,
    };
    let producer = match a.registry.registry()? {
        None => producer,
        Some(r) => {
            let subject = a.subject.clone().unwrap_or_else(|| denorm::codec::registry::value_subject(&kafka.topic));
            let p = producer.with_registry(&r, &subject, !a.no_register_schema).await.with_context(|| format!("getting the schema id of subject {subject:?} from {}", r.url()))?;
            if let denorm::produce::Framing::Registry(id) = p.framing() {
                let of = model.map_or_else(|| "schemas/command.avsc".to_string(), |d| format!("model {} version {}", d.name, d.version));
                eprintln!("schema-registry framing: subject {subject}, schema id {id} ({of})");
            }
            p
        }
    };
    let crossing = commands.iter().filter(|c| c.destination_key().is_some()).count();
    let owner_changes = commands.iter().filter(|c| c.previous_key().is_some()).count();
    // With --wait, one budget for the whole call; without, 60 s per barrier.
    let patience = match a.wait {
        Some(secs) => denorm::produce::Patience::within(std::time::Duration::from_secs(secs)),
        None => std::time::Duration::from_secs(60).into(),
    };
    if crossing > 0 {
        eprintln!("{crossing} rename(s) across top-level directories: what follows each is sent once group {} has applied it at its source", cli.group);
    }
    if owner_changes > 0 {
        eprintln!("{owner_changes} owner change(s): each is sent as the document's delete under its previous key and, once group {} has applied that, the upsert", cli.group);
    }
    // Read-your-writes and the printed deliveries cover both halves.
    let commands = denorm::command::expand_owner_changes(commands);
    // Without such renames this is `send_all`.
    let (deliveries, destinations) = if a.jsonl.is_none() {
        let keys: Vec<String> = commands.iter().map(|c| c.key().to_string()).collect();
        let (d, dest) = producer.send_ordered(&kafka, &cli.group, commands, 1, patience, |_| {}).await.context("sending the command")?;
        // One line per command sent (two for an owner change).
        for (key, d) in keys.iter().zip(&d) {
            println!("{}", serde_json::json!({"key": key, "partition": d.partition, "offset": d.offset}));
        }
        (d, dest)
    } else {
        let n = commands.len();
        let bar = super::progress(n as u64, "produced");
        let start = Instant::now();
        let (d, dest) = producer.send_ordered(&kafka, &cli.group, commands, a.in_flight, patience, |done| bar.set_position(done as u64)).await.context("sending commands")?;
        bar.finish_and_clear();
        let secs = start.elapsed().as_secs_f64();
        eprintln!("produced {n} commands in {secs:.1}s ({:.0}/s)", n as f64 / secs.max(1e-9));
        println!("{}", serde_json::json!({"produced": n}));
        (d, dest)
    };
    // Read-your-writes across keys: the destinations' partitions as of each
    // move, too.
    let deliveries: Vec<_> = deliveries.into_iter().chain(destinations).collect();
    if let Some(secs) = a.wait {
        let (group, left) = (cli.group.clone(), patience.left());
        tokio::task::spawn_blocking(move || denorm::kafka::wait_for_deliveries(&kafka, &group, &deliveries, left))
            .await?
            .with_context(|| format!("--wait {secs}: sent, but group {} had not applied everything when the time was up", cli.group))?;
        eprintln!("applied by group {}", cli.group);
    }
    Ok(())
}
