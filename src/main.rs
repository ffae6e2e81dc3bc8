//! `denorm`: parse the command line, set up logging, call the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = denorm::cli::Cli::parse();
    denorm::cli::init_tracing(&cli);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(denorm::cli::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(denorm::cli::exit_code(&e))
        }
    }
}
