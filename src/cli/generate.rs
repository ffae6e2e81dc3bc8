//! `denorm generate`: the demo's data set as JSONL on stdout, for
//! `denorm produce --jsonl -` (the docker-compose seed uses it).

use std::io::Write;

use clap::Args;

use denorm::demo;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    data: super::DataSetArgs,
}

pub fn run(a: &GenerateArgs) -> anyhow::Result<()> {
    let mut commands = a.data.load();
    let (dir, file) = demo::race();
    commands.extend([dir, file]);
    commands.extend(a.data.user_renames());
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for c in &commands {
        if let Err(e) = writeln!(out, "{}", denorm::command::jsonl::line(c)) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(e.into());
        }
    }
    out.flush().or_else(|e| if e.kind() == std::io::ErrorKind::BrokenPipe { Ok(()) } else { Err(e) })?;
    Ok(())
}
