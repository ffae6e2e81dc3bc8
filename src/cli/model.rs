//! `denorm model`: a model file (docs/model.md) read and checked, and what
//! it declares shown.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::UsageError;
use denorm::domain::{Domain, FieldType, OrderingKey};

#[derive(Debug, Args)]
pub struct ModelArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Read and check a model file (TOML): every name, type, reference, ordering key, copy
    /// and limit, and the earlier versions it names (`earlier`). Prints each kind with its key,
    /// fields, copies and nested lists, the model's fingerprint (what an index records of it)
    /// and those of the earlier versions whose commands it reads. Exit status 2 with the file, line,
    /// column and field of the first error
    Check {
        /// The model file (models/ holds the shipped ones)
        model: PathBuf,
    },
}

pub fn run(a: &ModelArgs) -> anyhow::Result<()> {
    let Action::Check { model } = &a.action;
    let d = Domain::load(model).map_err(|e| UsageError(e.to_string()))?;
    print!("{}", shown(&d));
    Ok(())
}

/// What a model declares, a kind a paragraph.
fn shown(d: &Domain) -> String {
    let mut out = format!("model {} version {} ({} kinds), fingerprint {}\n", d.name, d.version, d.kinds.len(), d.fingerprint());
    for e in &d.earlier {
        out.push_str(&format!("reads the commands of version {} too, fingerprint {}\n", e.version, e.fingerprint()));
    }
    for k in &d.kinds {
        let key = match &k.key {
            OrderingKey::Id => "its id".to_string(),
            OrderingKey::Owner { field, owner } => format!("its owner {owner} ({field})"),
            OrderingKey::PathTop { field } => format!("the top segment of {field}"),
        };
        out.push_str(&format!("\n{}: keyed by {key}\n", k.name));
        for f in &k.fields {
            let ty = match &f.ty {
                FieldType::Ref { kind } => format!("keyword, the id of a {kind}"),
                FieldType::Text { analyzer, exact } => format!("text ({} analyzer{})", analyzer.name(), if *exact { ", exact value indexed" } else { "" }),
                FieldType::Path => "path (ancestors indexed)".to_string(),
                other => other.name().to_string(),
            };
            out.push_str(&format!("  {}: {ty}{}\n", f.name, if f.optional { ", optional" } else { "" }));
        }
        for c in &k.copies {
            out.push_str(&format!("  copies from {} through {}: {}\n", c.owner, c.via, c.fields.iter().map(|f| format!("{}.{f}", c.name)).collect::<Vec<_>>().join(", ")));
        }
        for n in &k.nested {
            out.push_str(&format!("  nested list {}: {}\n", n.name, n.fields.iter().map(|f| format!("{} ({})", f.name, f.ty.name())).collect::<Vec<_>>().join(", ")));
        }
    }
    out
}
