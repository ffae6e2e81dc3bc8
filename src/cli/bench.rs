//! `denorm bench`: its flags ([`BenchArgs`]) mapped to [`crate::bench::harness`].

use super::{Cli, UsageError};
pub use crate::bench::harness::BenchArgs;
use crate::bench::harness::{BenchError, Launch};

pub async fn run(cli: &Cli, a: &BenchArgs) -> anyhow::Result<()> {
    let launch = Launch { kafka: cli.kafka(), kafka_options_file: cli.kafka_options_file.as_ref().map(|f| f.path.clone()), kafka_options: cli.kafka_options.clone() };
    crate::bench::harness::run(&launch, a).await.map_err(|e| match e {
        BenchError::Usage(m) => UsageError(m).into(),
        BenchError::Failed(e) => e,
    })
}
