//! `denorm schema`: the Avro schema producers write commands with, the
//! compiled-in domain's or a model's (docs/model.md, "Commands").

use std::path::PathBuf;

use clap::Args;

use super::UsageError;
use denorm::codec::model::ModelCodec;
use denorm::codec::{self, Codec};
use denorm::domain::Domain;

#[derive(Debug, Args)]
pub struct SchemaArgs {
    /// A model file: print the schema of its commands (every kind's upsert, patch, delete and,
    /// for a kind keyed by a path, rename of a prefix) instead of the compiled-in domain's
    /// (schemas/command.avsc)
    #[arg(long, value_name = "PATH")]
    model: Option<PathBuf>,
    /// Print only the schema's fingerprint: CRC-64-AVRO of its Parsing Canonical Form, in
    /// hex, as the 8 bytes after C3 01 of every message written with it
    #[arg(long)]
    fingerprint: bool,
}

pub fn run(a: &SchemaArgs) -> anyhow::Result<()> {
    let (text, fingerprint) = match &a.model {
        None => (codec::CURRENT_SCHEMA.to_string(), Codec::new().current_fingerprint()),
        Some(path) => {
            let c = ModelCodec::new(Domain::load(path).map_err(|e| UsageError(e.to_string()))?);
            (c.schema_text().to_string(), c.fingerprint())
        }
    };
    if a.fingerprint {
        println!("{fingerprint}");
    } else {
        print!("{text}");
    }
    Ok(())
}
