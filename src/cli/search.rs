//! `denorm search files|posts`, and `denorm search KIND` of a model's kind
//! (with `--model`).

use clap::{Args, Subcommand};

use super::{Cli, UsageError};
use denorm::index::filter::Filter;
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
    /// KIND [FILTERS]: the documents of a kind of the model (--model), every
    /// filter holding; `denorm search KIND --help` lists the filters
    #[command(external_subcommand)]
    Kind(Vec<String>),
}

/// The filters of a search of a model's kind (docs/model.md, "Searches").
#[derive(Debug, clap::Parser)]
struct KindSearch {
    /// FIELD=VALUE: the whole value of a keyword, ref, date, boolean (`true`, `false`) or
    /// keywords field, a path or one of its ancestors (`path.tree=/garden`), a copy's field
    /// (`customer.plan=gold`), a text's exact value (`name.raw=Ann Lee`); repeatable
    #[arg(long, value_name = "FIELD=VALUE", value_parser = super::parse_kv)]
    term: Vec<(String, String)>,
    /// PATH-FIELD=PREFIX: documents whose path lies beneath PREFIX (or is it); repeatable
    #[arg(long, value_name = "FIELD=PREFIX", value_parser = super::parse_kv)]
    under: Vec<(String, String)>,
    /// FIELD=WORDS: every word, analyzed as the text field is; repeatable
    #[arg(long = "match", value_name = "FIELD=WORDS", value_parser = super::parse_kv)]
    matches: Vec<(String, String)>,
    /// FIELD=NUMBER: an integer or float field above NUMBER; repeatable
    #[arg(long, value_name = "FIELD=NUMBER", value_parser = super::parse_kv)]
    above: Vec<(String, String)>,
    /// A filter as JSON (docs/model.md, "Searches"), such as one object of a nested list:
    /// '{"nested":{"list":"lines","all":[{"term":{"field":"sku","value":"a-1"}}]}}'; repeatable
    #[arg(long, value_name = "JSON")]
    filter: Vec<String>,
    /// FIELD: the matches counted by each value of FIELD (a keyword, ref, date, boolean,
    /// integer, path or keywords field, a copy's field, a text's exact value `name.raw`), the
    /// largest group first, ties in the order of their values; --limit counts groups. On
    /// Elasticsearch a terms aggregation counts them, but for a date, --per-group 0 or above 100,
    /// or more than 10,000 groups: those count every match
    #[arg(long, value_name = "FIELD")]
    group_by: Option<String>,
    /// With --group-by: the ids shown of each group, in id order (0: all)
    #[arg(long, default_value_t = 3, requires = "group_by")]
    per_group: usize,
    /// Most results (0: all)
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// One JSON object per line: the document as the index holds it (its fields, nested lists
    /// and copies); with --group-by, a group ({"value", "count", "ids"})
    #[arg(long)]
    json: bool,
}

impl KindSearch {
    fn filters(&self) -> Result<Vec<Filter>, UsageError> {
        let mut out: Vec<Filter> = Vec::new();
        out.extend(self.term.iter().map(|(field, value)| Filter::Term { field: field.clone(), value: value.clone() }));
        out.extend(self.under.iter().map(|(field, value)| Filter::Term { field: format!("{field}.tree"), value: value.clone() }));
        out.extend(self.matches.iter().map(|(field, text)| Filter::Match { field: field.clone(), text: text.clone() }));
        for (field, n) in &self.above {
            let gt = n.parse().map_err(|_| UsageError(format!("--above {field}={n}: {n:?} is not a number")))?;
            out.push(Filter::Above { field: field.clone(), gt });
        }
        for f in &self.filter {
            out.push(serde_json::from_str(f).map_err(|e| UsageError(format!("--filter {f}: {e}")))?);
        }
        Ok(out)
    }
}

/// `denorm search KIND`: `args` are the kind and its filters.
fn kind_search(cli: &Cli, a: &SearchArgs, args: &[String], runtime: tokio::runtime::Handle, emit: &mut dyn FnMut(String)) -> anyhow::Result<()> {
    let kind = &args[0];
    let Some(model) = cli.domain()? else {
        return Err(UsageError(format!("no search {kind:?}: `denorm search` knows files and posts, and with --model the model's kinds")).into());
    };
    let Some(declared) = model.kind(kind) else {
        let kinds: Vec<&str> = model.kinds.iter().map(|k| k.name.as_str()).collect();
        return Err(UsageError(format!("{kind:?} is not a kind of model {}: its kinds are {}", model.name, kinds.join(", "))).into());
    };
    let q = <KindSearch as clap::Parser>::try_parse_from(std::iter::once(format!("denorm search {kind}")).chain(args[1..].iter().cloned()))?;
    let filters = q.filters()?;
    filters.iter().try_for_each(|f| f.check(model, declared)).map_err(UsageError)?;
    let search = super::location(cli)?.search(runtime, Some(model)).map_err(|e| UsageError(e.to_string()))?;
    if let Some(field) = &q.group_by {
        let ty = denorm::index::group::check(model, declared, field).map_err(UsageError)?;
        let by = denorm::index::group::GroupBy { field: field.clone(), ty, limit: q.limit, per_group: q.per_group };
        for g in search.model_groups(a.tenant.as_deref(), kind, &filters, &by).map_err(|e| UsageError(e.to_string()))? {
            if q.json {
                emit(serde_json::to_string(&g).expect("json"));
                continue;
            }
            emit(format!("{} ({})", g.value.as_str().map_or_else(|| g.value.to_string(), str::to_string), g.count));
            g.ids.iter().for_each(|id| emit(format!("    {id}")));
        }
        return Ok(());
    }
    for (id, source) in search.model_documents(a.tenant.as_deref(), kind, &filters, q.limit).map_err(|e| UsageError(e.to_string()))? {
        emit(if q.json { source } else { id });
    }
    Ok(())
}

pub fn run(cli: &Cli, a: &SearchArgs, runtime: tokio::runtime::Handle) -> anyhow::Result<()> {
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
    if let What::Kind(args) = &a.what {
        kind_search(cli, a, args, runtime, &mut emit)?;
        return finish(out, write_err);
    }
    // An index that is not there exits 2, as a wrong --index would.
    let search = super::location(cli)?.search(runtime, cli.domain()?).map_err(|e| UsageError(e.to_string()))?;
    let tenant = tenant_of(a, search.as_ref())?;
    match &a.what {
        What::Kind(_) => unreachable!("searched above"),
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
    finish(out, write_err)
}

/// Flushes the results; a reader that went away (`| head`) is no error.
fn finish(mut out: impl std::io::Write, write_err: Option<std::io::Error>) -> anyhow::Result<()> {
    match write_err {
        Some(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Some(e) => Err(e.into()),
        None => Ok(out.flush().or_else(|e| if e.kind() == std::io::ErrorKind::BrokenPipe { Ok(()) } else { Err(e) })?),
    }
}
