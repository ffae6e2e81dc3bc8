//! `denorm search files|posts`.

use clap::{Args, Subcommand};

use super::{Cli, UsageError};
use denorm::index::{FileQuery, PostQuery, SearchIndex};

#[derive(Debug, Args)]
pub struct SearchArgs {
    /// Search this tenant's documents (see docs/tenants.md). Once the index
    /// holds any tenant's documents, a search names its tenant: this, or
    /// --default-tenant
    #[arg(long, global = true, value_name = "TENANT", env = "DENORM_TENANT", value_parser = super::parse_tenant)]
    tenant: Option<String>,
    /// Search the default tenant's documents (those of commands that name
    /// no tenant)
    #[arg(long, global = true, conflicts_with = "tenant")]
    default_tenant: bool,
    #[command(subcommand)]
    what: What,
}

/// The tenant a search reads: the one named, or the default one where no
/// tenant has documents.
fn tenant_of(a: &SearchArgs, search: &dyn SearchIndex) -> anyhow::Result<Option<String>> {
    if let Some(t) = &a.tenant {
        return Ok(Some(t.clone()));
    }
    if a.default_tenant {
        return Ok(None);
    }
    let tenants = search.tenants(6)?;
    if tenants.is_empty() {
        return Ok(None);
    }
    let more = if tenants.len() > 5 { ", ..." } else { "" };
    let named = tenants.iter().take(5).map(|t| format!("{t:?}")).collect::<Vec<_>>().join(", ");
    Err(UsageError(format!(
        "the index holds the documents of several tenants ({named}{more}): name the one to search with --tenant TENANT, or --default-tenant for the documents of commands that name none"
    ))
    .into())
}

#[derive(Debug, Subcommand)]
enum What {
    /// Files: exact directory, whole subtree, full text (combinable)
    Files {
        /// Files directly in this directory
        #[arg(long)]
        dir: Option<String>,
        /// Files anywhere beneath this directory
        #[arg(long)]
        under: Option<String>,
        /// Full-text query on the contents
        #[arg(long)]
        text: Option<String>,
        /// Most results (0: every match, streamed)
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// One JSON object per line: {"id","name","path","contents"}
        #[arg(long)]
        json: bool,
    },
    /// Blog posts: full text, author name, grouped by author
    Posts {
        /// Full-text query on title and body
        #[arg(long)]
        text: Option<String>,
        /// Query on the author's name
        #[arg(long)]
        author: Option<String>,
        /// Per author the best posts, authors ordered by their best score
        #[arg(long)]
        group_by_author: bool,
        /// Posts shown per author with --group-by-author (Elasticsearch: at most 100, its
        /// index.max_inner_result_window)
        #[arg(long, default_value_t = 3)]
        per_author: usize,
        /// Most results, or authors with --group-by-author (0: all)
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// One JSON object per line: {"id","title","body","user":{"id","name"}}
        /// (with --group-by-author: {"author","best_score","posts":[...]})
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cli: &Cli, a: &SearchArgs, runtime: tokio::runtime::Handle) -> anyhow::Result<()> {
    // An index that is not there exits 2, as a wrong --index would.
    let search = super::location(cli)?.search(runtime).map_err(|e| UsageError(e.to_string()))?;
    let tenant = tenant_of(a, search.as_ref())?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    use std::io::Write;
    let mut write_err: Option<std::io::Error> = None;
    let mut emit = |line: String| {
        if write_err.is_none() {
            if let Err(e) = writeln!(out, "{line}") {
                write_err = Some(e);
            }
        }
    };
    match &a.what {
        What::Files { dir, under, text, limit, json } => {
            let q = FileQuery { tenant, dir: dir.clone(), under: under.clone(), text: text.clone() };
            search.files(&q, *limit, &mut |f| {
                let f = f.unscoped();
                emit(if *json { serde_json::to_string(&f).expect("json") } else { format!("{}\t{}", f.full_path(), f.id) })
            })?;
        }
        What::Posts { text, author, group_by_author, per_author, limit, json } => {
            let q = PostQuery { tenant, text: text.clone(), author: author.clone() };
            if *group_by_author {
                for mut g in search.posts_by_author(&q, *limit, *per_author)? {
                    g.posts = g.posts.into_iter().map(|p| p.unscoped()).collect();
                    if *json {
                        emit(serde_json::to_string(&g).expect("json"));
                    } else {
                        emit(format!("{} (best score {:.2})", g.author, g.best_score));
                        for p in g.posts {
                            emit(format!("    {}\t{}", p.title, p.id));
                        }
                    }
                }
            } else {
                search.posts(&q, *limit, &mut |p| {
                    let p = p.unscoped();
                    emit(if *json { serde_json::to_string(&p).expect("json") } else { format!("{}\t{}\t{}", p.title, p.user.name, p.id) })
                })?;
            }
        }
    }
    match write_err {
        Some(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Some(e) => Err(e.into()),
        None => Ok(out.flush().or_else(|e| if e.kind() == std::io::ErrorKind::BrokenPipe { Ok(()) } else { Err(e) })?),
    }
}
