//! `braid-launch -n N -- PROGRAM ARGS...`: starts N ranks of a tcp job on
//! this host, prefixes their output with the rank, and fails (ending the
//! others, exiting with the failed rank's status) as soon as one rank
//! fails; with `--timeout SECS` it also stops
//! a job that runs too long (a rank stuck waiting) and exits 124.

use std::ffi::OsString;
use std::process::ExitCode;

use braid_core::launch::{LaunchError, LaunchSpec, launch};
use braid_examples::{STOPPED_EXIT, TIMED_OUT_EXIT};
use clap::Parser;

/// Start the ranks of a braid tcp job on this host.
#[derive(Debug, Parser)]
#[command(name = "braid-launch", version)]
struct Cli {
    /// Number of ranks.
    #[arg(short = 'n', long = "ranks")]
    ranks: u32,
    /// Stop every rank and fail (exit status 124) if the job runs longer
    /// than this many seconds (fractions allowed). Default: no limit.
    #[arg(long, value_name = "SECS", value_parser = parse_secs, allow_negative_numbers = true)]
    timeout: Option<std::time::Duration>,
    /// The program to run, then its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

/// The longest `--timeout`: a year.
const MAX_TIMEOUT_SECS: f64 = 365.0 * 24.0 * 3600.0;

/// A positive number of seconds, at most a year.
fn parse_secs(text: &str) -> Result<std::time::Duration, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number of seconds"))?;
    if secs.is_nan() || secs <= 0.0 {
        return Err(format!(
            "'{text}': the timeout must be a positive number of seconds"
        ));
    }
    // (A number past f64's range reads as infinite: it is too long, not
    // negative. A job without a limit leaves `--timeout` out.)
    if secs > MAX_TIMEOUT_SECS {
        return Err(format!(
            "'{text}': the timeout must be at most {MAX_TIMEOUT_SECS} s (a year); leave --timeout out for none"
        ));
    }
    if secs < 0.001 {
        return Err(format!("'{text}': the timeout must be at least 0.001 s"));
    }
    std::time::Duration::try_from_secs_f64(secs).map_err(|e| format!("'{text}': {e}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut cmd = cli.command.into_iter();
    let Some(program) = cmd.next() else {
        braid_examples::errln!("braid-launch: no program given");
        return ExitCode::from(2);
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            braid_examples::errln!("braid-launch: {e}");
            return ExitCode::from(2);
        }
    };
    let mut spec = LaunchSpec::new(cli.ranks, program, cmd.collect());
    spec.timeout = cli.timeout;
    let timeout = cli.timeout;
    match rt.block_on(launch(spec)) {
        Ok(report) => {
            if !report.outlived_timeout.is_empty() {
                braid_examples::errln!(
                    "braid-launch: the timeout of {} s passed while rank(s) {} still ran; they were stopped, and each ended with status 0 (a rank stopped while it commits its output finishes the commit), so the job is whole",
                    timeout.map_or(0.0, |t| t.as_secs_f64()),
                    report
                        .outlived_timeout
                        .iter()
                        .map(|r| r.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                );
            }
            ExitCode::SUCCESS
        }
        Err(e @ LaunchError::Interrupted) => {
            braid_examples::errln!("braid-launch: {e}");
            ExitCode::from(STOPPED_EXIT)
        }
        Err(e @ LaunchError::TimedOut { .. }) => {
            braid_examples::errln!("braid-launch: {e}");
            ExitCode::from(TIMED_OUT_EXIT)
        }
        Err(e @ LaunchError::RankFailed { .. }) => {
            braid_examples::errln!("braid-launch: {e}");
            // The failed rank's own status (its usage error's 2, say).
            ExitCode::from(braid_examples::failed_rank_status(&e))
        }
        Err(e) => {
            braid_examples::errln!("braid-launch: {e}");
            ExitCode::FAILURE
        }
    }
}
