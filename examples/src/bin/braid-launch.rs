//! `braid-launch -n N -- PROGRAM ARGS...`: starts N ranks of a tcp job on
//! this host, prefixes their output with the rank, and fails (ending the
//! others) as soon as one rank fails.

use std::ffi::OsString;
use std::process::ExitCode;

use braid_core::launch::{LaunchError, LaunchSpec, launch};
use clap::Parser;

/// Start the ranks of a braid tcp job on this host.
#[derive(Debug, Parser)]
#[command(name = "braid-launch", version)]
struct Cli {
    /// Number of ranks.
    #[arg(short = 'n', long = "ranks")]
    ranks: u32,
    /// The program to run, then its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut cmd = cli.command.into_iter();
    let Some(program) = cmd.next() else {
        eprintln!("braid-launch: no program given");
        return ExitCode::from(2);
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("braid-launch: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(launch(LaunchSpec::new(cli.ranks, program, cmd.collect()))) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e @ LaunchError::Interrupted) => {
            eprintln!("braid-launch: {e}");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("braid-launch: {e}");
            ExitCode::FAILURE
        }
    }
}
