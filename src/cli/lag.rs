//! `denorm lag`: committed offset, end offset, lag and commands not applied
//! per partition.

use anyhow::Context;
use clap::Args;

use super::Cli;
use denorm::kafka;

#[derive(Debug, Args)]
pub struct LagArgs {
    /// Print `{"total":N,"unapplied":U,"partitions":[{"partition":P,"committed":C,"end":E,"lag":L,"unapplied":U}]}`
    /// (`unapplied`: the lag less the commands a fan-out's key lanes applied above the committed
    /// offset, as the offset commit's metadata records; the lag itself where the broker keeps no
    /// metadata)
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
    println!("{:>9} {:>12} {:>12} {:>10} {:>10}", "partition", "committed", "end", "lag", "unapplied");
    for p in &report.partitions {
        println!("{:>9} {:>12} {:>12} {:>10} {:>10}", p.partition, p.committed, p.end, p.lag, p.unapplied);
    }
    println!("{:>9} {:>12} {:>12} {:>10} {:>10}", "total", "", "", report.total, report.unapplied);
    Ok(())
}
