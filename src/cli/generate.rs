//! `denorm generate`: the demo's data set as JSONL on stdout, for
//! `denorm produce --jsonl -` (the docker-compose seed uses it).

use std::io::Write;

use clap::Args;

use crate::demo;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Files in the data set
    #[arg(long, default_value_t = 50_000)]
    files: usize,
    /// Users in the data set
    #[arg(long, default_value_t = 1_000)]
    users: usize,
    /// Posts in the data set
    #[arg(long, default_value_t = 10_000)]
    posts: usize,
    /// Also emit the race (two renames in /clinton) and this many user renames
    #[arg(long, default_value_t = 20)]
    renamed_users: usize,
    /// Seed of the generator
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

pub fn run(a: &GenerateArgs) -> anyhow::Result<()> {
    let mut commands = demo::seed(a.files, a.users, a.posts, a.seed);
    if a.renamed_users > 0 {
        let (dir, file) = demo::race();
        commands.extend([dir, file]);
        commands.extend(demo::user_renames(a.renamed_users.min(a.users), a.seed));
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for c in &commands {
        if let Err(e) = writeln!(out, "{}", serde_json::to_string(c)?) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(e.into());
        }
    }
    out.flush().or_else(|e| if e.kind() == std::io::ErrorKind::BrokenPipe { Ok(()) } else { Err(e) })?;
    Ok(())
}
