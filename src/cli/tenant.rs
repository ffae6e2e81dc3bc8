//! `denorm tenant`: operations on one tenant's documents (see
//! docs/tenants.md).

use anyhow::Context;
use clap::{Args, Subcommand};

use super::{Cli, UsageError};
use denorm::index::open::Location;

#[derive(Debug, Args)]
pub struct TenantArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Elasticsearch: put the tenant's filtered read aliases (<prefix>-t-<tenant>-files, -users,
    /// -posts: its documents only, routed by the tenant) on the current generation; a rebuild's
    /// cutover moves them along. Give the tenant's own application a credential that may read
    /// these aliases only (docs/tenants.md). Running it again replaces them
    Alias {
        /// The tenant
        #[arg(value_parser = super::parse_tenant)]
        tenant: String,
    },
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
    }
}
