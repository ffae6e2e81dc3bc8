//! `denorm schema`: the Avro schema producers write commands with, the
//! compiled-in domain's or a model's (docs/model.md, "Commands").

use clap::Args;

use denorm::codec::model::ModelCodec;
use denorm::codec::{self, Codec};

#[derive(Debug, Args)]
pub struct SchemaArgs {
    /// Print only the schema's fingerprint: CRC-64-AVRO of its Parsing Canonical Form, in
    /// hex, as the 8 bytes after C3 01 of every message written with it
    #[arg(long)]
    fingerprint: bool,
}

/// With the global `--model`: the schema of its commands (every kind's
/// upsert, patch, delete and, for a kind keyed by a path, rename of a
/// prefix) instead of the compiled-in domain's (schemas/command.avsc).
pub fn run(cli: &super::Cli, a: &SchemaArgs) -> anyhow::Result<()> {
    let (text, fingerprint) = match cli.domain()? {
        None => (codec::CURRENT_SCHEMA.to_string(), Codec::new().current_fingerprint()),
        Some(d) => {
            let c = ModelCodec::new(d.clone());
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
