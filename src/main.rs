//! `denorm`: parse the command line, set up logging, call the library.

use std::process::ExitCode;

use clap::Parser;

mod bench;
mod cli;

/// mimalloc instead of glibc's malloc. glibc gives each allocating thread
/// its own arena and keeps freed memory there: a worker's threads
/// (appliers, tantivy's indexer and merge threads, librdkafka's) held two to
/// three times what they used. In `denorm bench` (300,000-file rename, 2
/// cores) mimalloc cut the worker's heap before the rename from 294 to
/// 231 MB and its CPU time for 120,000 single-document commands from about
/// 2.2 to 1.3-1.7 s; limiting glibc to two arenas saved more memory but
/// cost throughput. `alloc::tune` sets two of its options.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    denorm::alloc::tune();
    let cli = cli::Cli::parse();
    cli::init_tracing(&cli);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(cli::exit_code(&e))
        }
    }
}
