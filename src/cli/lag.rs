//! `denorm lag`: committed offset, end offset and lag per partition.

use anyhow::Context;
use clap::Args;

use super::Cli;
use crate::kafka;

#[derive(Debug, Args)]
pub struct LagArgs {
    /// Print `{"total":N,"partitions":[{"partition":P,"committed":C,"end":E,"lag":L}]}`
    #[arg(long)]
    json: bool,
}

pub async fn run(cli: &Cli, a: &LagArgs) -> anyhow::Result<()> {
    let cfg = cli.kafka();
    let group = cli.group.clone();
    let report = tokio::task::spawn_blocking(move || kafka::group_lag(&cfg, &group)).await?.with_context(|| format!("reading the lag of group {}", cli.group))?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!("{:>9} {:>12} {:>12} {:>10}", "partition", "committed", "end", "lag");
    for p in &report.partitions {
        println!("{:>9} {:>12} {:>12} {:>10}", p.partition, p.committed, p.end, p.lag);
    }
    println!("{:>9} {:>12} {:>12} {:>10}", "total", "", "", report.total);
    Ok(())
}
