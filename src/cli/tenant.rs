//! `denorm tenant`: operations on one tenant's documents (see
//! docs/tenants.md).

use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::{Cli, UsageError};
use denorm::command::{Command, LogPosition};
use denorm::index::open::{Access, Embedded, Location};
use denorm::index::Doc;

#[derive(Debug, Args)]
pub struct TenantArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Elasticsearch: put the tenant's filtered read aliases (<prefix>-t-<tenant>-files, -users,
    /// -posts: its documents only, routed by the tenant) on the current generation; a rebuild's
    /// cutover moves them along. Running it again replaces them. An alias is a view, not an
    /// access boundary (a GET or _mget by id ignores its filter): give the tenant's own
    /// application a credential with document-level security, a role whose query is the
    /// tenant's term (docs/tenants.md)
    Alias {
        /// The tenant
        #[arg(value_parser = super::parse_tenant)]
        tenant: String,
    },
    /// Remove every document of the tenant through the log: waits until the group (--group) has
    /// applied what the topic holds now, reads the tenant's documents from the index, sends a
    /// delete_post, delete_file or delete_user for each under its own key (with --model, also
    /// each document of the model: its kind's delete), waits until they are
    /// applied and checks that none is left (exit 1 if some are: written by a command sent
    /// meanwhile). A replay or a rebuild removes them again. Stop the tenant's producers first
    Delete {
        /// The tenant
        #[arg(value_parser = super::parse_tenant)]
        tenant: String,
        /// Send the deletes (without it: count the tenant's documents, send nothing, exit 2)
        #[arg(long)]
        yes: bool,
        /// Give up after this many seconds, for each of the two waits (before reading the
        /// documents, and for their deletes)
        #[arg(long, default_value_t = 600, value_name = "SECONDS")]
        wait: u64,
    },
}

/// What `denorm tenant delete` removes, by kind.
#[derive(Debug, Default, serde::Serialize)]
struct Removed {
    files: u64,
    users: u64,
    posts: u64,
    /// A declared model's documents, by kind (`--model`).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    model: std::collections::BTreeMap<&'static str, u64>,
}

impl Removed {
    fn total(&self) -> u64 {
        self.files + self.users + self.posts + self.model.values().sum::<u64>()
    }
}

/// The deletes of a tenant's documents, as they are read (a document's
/// contents are not kept): users' own deletes after the posts'.
#[derive(Default)]
struct Deletes {
    first: Vec<Command>,
    users: Vec<Command>,
    removed: Removed,
    /// Documents no delete of their model can name (no key field).
    unwritable: Vec<String>,
}

impl Deletes {
    fn add(&mut self, d: Doc) {
        match d {
            Doc::File(f) => {
                self.removed.files += 1;
                self.first.push(Command::DeleteFile { path: f.full_path(), id: f.id });
            }
            Doc::Post(p) => {
                self.removed.posts += 1;
                self.first.push(Command::DeletePost { id: p.id, user_id: p.user.id });
            }
            Doc::User(u) => {
                self.removed.users += 1;
                self.users.push(Command::DeleteUser { id: u.id });
            }
            // A declared model's document: its kind's delete under the
            // key it is held by.
            Doc::Model(m) => {
                *self.removed.model.entry(m.kind.as_str()).or_default() += 1;
                match m.delete() {
                    Ok(c) => self.first.push(c),
                    Err(e) => self.unwritable.push(format!("{} {}: {e}", m.kind.as_str(), m.unscoped_id())),
                }
            }
        }
    }

    /// The commands in the order they are sent, and their count by kind.
    fn commands(mut self) -> (Vec<Command>, Removed) {
        self.first.append(&mut self.users);
        (self.first, self.removed)
    }
}

pub async fn run(cli: &Cli, a: &TenantArgs) -> anyhow::Result<()> {
    match &a.action {
        Action::Alias { tenant } => {
            let Location::Elastic(es) = super::location(cli)? else {
                return Err(UsageError("the embedded index has no aliases: search a tenant's documents with `denorm search --tenant`".into()).into());
            };
            let client = es.client().context("connecting to Elasticsearch")?;
            let names = denorm::index::elastic::generations::add_tenant_aliases(&client, &es.prefix, tenant).await.with_context(|| format!("adding the aliases of tenant {tenant}"))?;
            for n in names {
                println!("{n}");
            }
            Ok(())
        }
        Action::Delete { tenant, yes, wait } => delete(cli, tenant, *yes, Duration::from_secs(*wait)).await,
    }
}

/// The deletes of the tenant's documents in the index now (a blocking
/// read, off the runtime's threads).
async fn deletes_of(cli: &Cli, tenant: &str) -> anyhow::Result<Deletes> {
    let location = super::location(cli)?;
    let model = cli.domain()?;
    let (tenant, runtime) = (tenant.to_string(), tokio::runtime::Handle::current());
    tokio::task::spawn_blocking(move || -> anyhow::Result<Deletes> {
        let search = location.search(runtime, model).map_err(|e| UsageError(e.to_string()))?;
        let mut deletes = Deletes::default();
        search.dump_tenant(&tenant, &mut |d| deletes.add(d)).with_context(|| format!("reading the documents of tenant {tenant}"))?;
        Ok(deletes)
    })
    .await?
}

async fn delete(cli: &Cli, tenant: &str, yes: bool, wait: Duration) -> anyhow::Result<()> {
    let kafka = cli.kafka();
    let group = cli.group.clone();
    // Opened with the model given (or none): an index holding another is
    // refused before anything is sent, as its documents would be left
    // behind and the delete reported done.
    let model = cli.domain()?;
    super::location(cli)?.backend(&kafka.topic, Access::Existing, Embedded { model, ..Embedded::with_memory(15 << 20) }).await.map_err(|e| UsageError(e.to_string()))?;
    // What the topic holds now is applied first: the index then has every
    // document of the tenant that a command sent before this one created.
    let (k, g) = (kafka.clone(), group.clone());
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let partitions = k.topic_partitions().context("reading the topic's metadata")?.ok_or_else(|| UsageError(format!("topic {} does not exist", k.topic)))?;
        let ends = denorm::verify::log::last_offsets(&k, partitions)?;
        let last: Vec<LogPosition> = ends.into_iter().filter(|(_, last)| *last >= 0).map(|(partition, offset)| LogPosition { partition, offset }).collect();
        eprintln!("waiting until group {g} has applied what the topic holds now");
        denorm::kafka::wait_for_deliveries(&k, &g, &last, wait).with_context(|| format!("group {g} had not applied the topic's commands after {} s: nothing was sent", wait.as_secs()))
    })
    .await??;
    let deletes = deletes_of(cli, tenant).await?;
    if let Some(first) = deletes.unwritable.first() {
        return Err(UsageError(format!("nothing was sent: {} documents of tenant {tenant} cannot be named by a delete of their model, first {first}", deletes.unwritable.len())).into());
    }
    let (commands, removed) = deletes.commands();
    let n = commands.len();
    if !yes {
        let models: String = removed.model.iter().map(|(k, n)| format!(", {n} {k}")).collect();
        eprintln!("tenant {tenant}: {} files, {} users, {} posts{models}", removed.files, removed.users, removed.posts);
        return Err(UsageError(format!("nothing was sent: add --yes to delete the {n} documents of tenant {tenant} through the log")).into());
    }
    let mut producer = denorm::produce::Producer::new(&kafka)?;
    if let Some(d) = model {
        producer = producer.with_model(d);
    }
    let bar = super::progress(n as u64, "deletes sent");
    let deliveries = producer.send_all(commands, 10_000, |done| bar.set_position(done as u64)).await.context("sending the deletes")?;
    bar.finish_and_clear();
    eprintln!("sent {n} deletes; waiting until group {group} has applied them");
    let (k, g) = (kafka.clone(), group.clone());
    tokio::task::spawn_blocking(move || denorm::kafka::wait_for_deliveries(&k, &g, &deliveries, wait))
        .await?
        .with_context(|| format!("the deletes were sent, but group {group} had not applied them after {} s", wait.as_secs()))?;
    let left = deletes_of(cli, tenant).await?.removed.total();
    println!("{}", serde_json::json!({"tenant": tenant, "deleted": removed, "left": left}));
    if left > 0 {
        anyhow::bail!(
            "{left} documents of tenant {tenant} are left: a key of the tenant is parked behind a dead letter, and its deletes wait there (`denorm dlq count --tenant {tenant}`; reprocess or clear them), or commands of the tenant were applied after its documents were read (stop its producers); then run this again"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use denorm::command::tenant::scope;
    use denorm::index::{Author, FileDoc, PostDoc, UserDoc};

    /// Each document's delete under its own (scoped) key; a user's own
    /// delete after its posts'.
    #[test]
    fn each_document_gets_its_delete_under_its_key_and_users_go_last() {
        let t = |v: &str| scope(Some("acme"), v);
        let docs = vec![
            Doc::User(UserDoc { id: t("1"), name: "J".into(), email: "j@x".into(), dob: "1970-01-01".into(), pos: 1 }),
            Doc::File(FileDoc::at(&t("f1"), &t("/docs/a/f1.txt"), "x", 2)),
            Doc::Post(PostDoc { id: t("p1"), title: "T".into(), body: "B".into(), user: Author { id: t("1"), name: "J".into() }, pos: 3 }),
        ];
        let mut deletes = Deletes::default();
        docs.into_iter().for_each(|d| deletes.add(d));
        let (commands, removed) = deletes.commands();
        assert_eq!((removed.files, removed.users, removed.posts), (1, 1, 1));
        assert_eq!(commands, vec![Command::DeleteFile { id: t("f1"), path: t("/docs/a/f1.txt") }, Command::DeletePost { id: t("p1"), user_id: t("1") }, Command::DeleteUser { id: t("1") },]);
        let keys: Vec<&str> = commands.iter().map(Command::key).collect();
        assert_eq!(keys, vec![t("/docs").as_str(), t("1").as_str(), t("1").as_str()]);
        for c in &commands {
            c.validate_scoped().unwrap();
            assert_eq!(c.tenant(), Some("acme"));
        }
    }
}
