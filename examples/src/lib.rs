//! Shared plumbing of braid's runnable jobs: the `--ranks`/`--backend`
//! options every example takes, and starting the job on them.
//!
//! With `--backend local` every rank is a task of this process. With
//! `--backend tcp` this process becomes the launcher: it starts `--ranks`
//! copies of itself with the rank environment set (see
//! `braid_core::launch`), and each copy runs one rank.

use std::future::Future;

use braid_core::comm::tcp::TcpConfig;
use braid_core::launch::{LaunchError, LaunchSpec, launch};
use braid_core::{Backend, BoxError, Context, MemoryLimits, Rank, WorldSpec};

/// Options shared by every example.
#[derive(Debug, Clone, clap::Args)]
pub struct JobArgs {
    /// Number of ranks [default: 4] (under `--backend mpi`, mpirun's or
    /// srun's count; `--ranks` may only repeat it).
    #[arg(long, allow_negative_numbers = true)]
    pub ranks: Option<u32>,
    /// How ranks talk: `local` (threads of this process), `tcp` (one
    /// process per rank on this host) or `mpi` (ranks started by mpirun or
    /// srun; needs the `mpi` feature) [default: local, or tcp in a rank
    /// that braid-launch started].
    #[arg(long, env = "BRAID_BACKEND")]
    pub backend: Option<Backend>,
}

/// The error for `--backend mpi` on a build without the `mpi` feature.
const MPI_FEATURE_NEEDED: &str = "--backend mpi needs a build with the mpi feature (cargo build --release --features braid-examples/mpi), started by mpirun or srun";

/// The ranks a job runs without `--ranks`.
pub const DEFAULT_RANKS: u32 = 4;

pub use braid_core::world::mpi_launch_size;

/// The most ranks `--ranks` starts on one host (tasks or processes); more
/// would only exhaust its memory and threads.
pub const MAX_HOST_RANKS: u32 = 1024;

impl JobArgs {
    /// The number of ranks asked for (`--ranks`, or [`DEFAULT_RANKS`]).
    pub fn ranks(&self) -> u32 {
        self.ranks.unwrap_or(DEFAULT_RANKS)
    }

    /// The backend asked for (`--backend` or `BRAID_BACKEND`; `local`
    /// where neither says).
    pub fn backend(&self) -> Backend {
        self.backend.unwrap_or(Backend::Local)
    }

    /// Checks `--ranks` and `--backend` against each other and against
    /// how this process was started, before any work.
    pub fn check(&self) -> Result<(), String> {
        self.check_with(mpi_launch_size())
    }

    /// [`JobArgs::check`] for a process that mpirun or srun started as
    /// one of `launched` ranks (`None`: not started by them).
    fn check_with(&self, launched: Option<(&'static str, u32)>) -> Result<(), String> {
        let ranks = self.ranks();
        if ranks == 0 {
            return Err("--ranks must be at least 1".into());
        }
        if self.backend() == Backend::Mpi && !cfg!(feature = "mpi") {
            return Err(MPI_FEATURE_NEEDED.into());
        }
        match (self.backend(), launched) {
            // Each process would run a whole job of its own, all of them
            // writing the same output.
            (b, Some((var, n))) if b != Backend::Mpi && n > 1 => {
                return Err(format!(
                    "this process is one of {n} started by mpirun or srun ({var}={n}), but --backend is {b}: each would run a whole job of its own; pass --backend mpi (or set BRAID_BACKEND=mpi)"
                ));
            }
            (Backend::Mpi, launched) => {
                let n = launched.map_or(1, |(_, n)| n.max(1));
                if self.ranks.is_some_and(|r| r != n) {
                    return Err(format!(
                        "--ranks {ranks} under --backend mpi, which runs the {n} rank(s) mpirun or srun started: start {ranks} with `mpirun -np {ranks}` (or drop --ranks)"
                    ));
                }
            }
            _ => {}
        }
        if self.backend() != Backend::Mpi && ranks > MAX_HOST_RANKS {
            return Err(format!(
                "--ranks {ranks} is more than the {MAX_HOST_RANKS} ranks one host runs (--backend {})",
                self.backend()
            ));
        }
        Ok(())
    }
}

/// The exit status of a job stopped by a signal (Ctrl-C, SIGTERM, SIGHUP),
/// as shells report a command ended by Ctrl-C.
pub const STOPPED_EXIT: u8 = 130;

/// The exit status of a job stopped at its timeout (`braid-launch
/// --timeout`), as coreutils' `timeout` exits.
pub const TIMED_OUT_EXIT: u8 = 124;

/// The exit status for a job that failed with `err`: [`STOPPED_EXIT`]
/// where its launcher (`--backend tcp`) was stopped by a signal,
/// [`TIMED_OUT_EXIT`] where it ran past its timeout, otherwise
/// [`braid_core::world::exit_code`]'s.
pub fn exit_code(err: &(dyn std::error::Error + 'static)) -> std::process::ExitCode {
    let mut cur = Some(err);
    while let Some(e) = cur {
        match e.downcast_ref::<LaunchError>() {
            Some(LaunchError::Interrupted) => return std::process::ExitCode::from(STOPPED_EXIT),
            Some(LaunchError::TimedOut { .. }) => {
                return std::process::ExitCode::from(TIMED_OUT_EXIT);
            }
            Some(e @ LaunchError::RankFailed { .. }) => {
                return std::process::ExitCode::from(failed_rank_status(e));
            }
            _ => {}
        }
        cur = e.source();
    }
    braid_core::world::exit_code(err)
}

/// The exit status a launcher of tcp ranks ends with when `e` says a
/// rank failed: that rank's own (a usage error's 2 stays 2), or 1 where
/// it has none in 1..=255 (killed by a signal).
pub fn failed_rank_status(e: &LaunchError) -> u8 {
    match e {
        LaunchError::RankFailed { rank, report, .. } => report
            .status
            .get(*rank as usize)
            .copied()
            .flatten()
            .and_then(|s| s.code())
            .and_then(|c| u8::try_from(c).ok())
            .filter(|c| *c != 0)
            .unwrap_or(1),
        _ => 1,
    }
}

/// Writes to stdout as `print!` does, except that a closed stdout (the
/// reader of `| head` gone) ends the process quietly with status 0, where
/// `print!` panics; any other write error ends it with status 1.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::write_stdout(format_args!($($arg)*))
    };
}

/// [`out!`] with a newline, as `println!`.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// What [`out!`] and [`outln!`] call.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        errln!("error: writing to stdout: {e}");
        std::process::exit(1);
    }
}

/// Writes to stderr as `eprint!` does, but a broken or failing stderr is
/// ignored: `eprint!` panics there, so a tool whose stderr went to a
/// reader that ended (`2>&1 | head -1`) exited 101 instead of with its
/// job's status (a failed rank's, 130, 124).
#[macro_export]
macro_rules! err {
    ($($arg:tt)*) => {
        $crate::write_stderr(format_args!($($arg)*))
    };
}

/// [`err!`] with a newline, as `eprintln!`.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::write_stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// What [`err!`] and [`errln!`] call: one write of the whole text (lines
/// of several ranks do not interleave), its failure ignored.
pub fn write_stderr(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let text = args.to_string();
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Installs a tracing subscriber reading `RUST_LOG` (default: warnings);
/// colours only where stderr is a terminal (not in a file or a pipe).
pub fn init_tracing() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

/// The median of a benchmark's samples (robust against the odd
/// descheduled run): the mean of the middle two for an even count, NaN
/// for none.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A byte count for tables, exact: `8 B`, `64 KiB`, `16 MiB`, and a size
/// that is no whole number of KiB or MiB in bytes (`2000000 B`).
pub fn size_name(s: usize) -> String {
    if s >= 1 << 20 && s % (1 << 20) == 0 {
        format!("{} MiB", s >> 20)
    } else if s >= 1 << 10 && s % (1 << 10) == 0 {
        format!("{} KiB", s >> 10)
    } else {
        format!("{s} B")
    }
}

/// What running a job gave this process.
pub enum JobOutcome<T> {
    /// This process ran ranks (all of them for local, one for tcp); their
    /// results by rank.
    Ran(Vec<(Rank, T)>),
    /// This process launched the tcp ranks, which all succeeded.
    Launched,
}

/// Runs `job` as `args` asks. Under the tcp backend, the first call starts
/// the rank processes (copies of this program with the same arguments) and
/// returns `Launched` once they all succeed; inside a rank process it runs
/// that one rank.
pub fn run_job<T, F, Fut>(
    args: &JobArgs,
    limits: MemoryLimits,
    job: F,
) -> Result<JobOutcome<T>, BoxError>
where
    F: Fn(Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, BoxError>> + Send + 'static,
    T: Send + 'static,
{
    run_job_with_progress(args, limits, None, job)
}

/// [`run_job`], where the process that launches tcp ranks sums their
/// progress reports into `progress` (each rank reports through a
/// [`braid_core::rank_progress::ProgressReporter`]).
pub fn run_job_with_progress<T, F, Fut>(
    args: &JobArgs,
    limits: MemoryLimits,
    progress: Option<std::sync::Arc<braid_core::rank_progress::Progress>>,
    job: F,
) -> Result<JobOutcome<T>, BoxError>
where
    F: Fn(Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, BoxError>> + Send + 'static,
    T: Send + 'static,
{
    args.check()?;
    let spec = match (args.backend(), TcpConfig::from_env()?) {
        #[cfg(feature = "mpi")]
        (Backend::Mpi, _) => WorldSpec::Mpi,
        #[cfg(not(feature = "mpi"))]
        (Backend::Mpi, _) => return Err(MPI_FEATURE_NEEDED.into()),
        // Asked for in-process ranks, but started as one rank of a job:
        // each process would run a whole job of its own.
        (Backend::Local, Some(cfg)) if args.backend.is_some() => {
            return Err(format!(
                "--backend local (or BRAID_BACKEND=local), but this process is rank {} of the {} that braid-launch started: drop --backend (the ranks talk over tcp) or run without braid-launch",
                cfg.rank, cfg.nranks
            )
            .into());
        }
        (_, Some(cfg)) => {
            // A rank of a job that `braid-launch` (or `--backend tcp`)
            // started: the launcher's count is the job's.
            if args.ranks.is_some_and(|r| r != cfg.nranks) {
                return Err(format!(
                    "--ranks {}, but this process is one of the {n} ranks its launcher started (BRAID_NRANKS={n}): start {} ranks with `braid-launch -n {}` (or drop --ranks)",
                    args.ranks(),
                    args.ranks(),
                    args.ranks(),
                    n = cfg.nranks
                )
                .into());
            }
            WorldSpec::Tcp(cfg)
        }
        (Backend::Local, None) => WorldSpec::Local {
            nranks: args.ranks(),
        },
        (Backend::Tcp, None) => {
            let exe = std::env::current_exe()?;
            let argv: Vec<_> = std::env::args_os().skip(1).collect();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            let mut spec = LaunchSpec::new(args.ranks(), exe, argv);
            spec.progress = progress;
            rt.block_on(launch(spec))?;
            return Ok(JobOutcome::Launched);
        }
    };
    Ok(JobOutcome::Ran(braid_core::run_world(&spec, limits, job)?))
}

#[cfg(test)]
mod tests {
    use super::{Backend, JobArgs, median, size_name};

    /// A process started by mpirun or srun must run with `--backend mpi`
    /// (each would otherwise run a whole job of its own), and `--ranks`
    /// under mpi may only repeat the launcher's count.
    #[test]
    fn backend_and_ranks_fit_how_the_process_was_started() {
        let args = |ranks: Option<u32>, backend| JobArgs {
            ranks,
            backend: Some(backend),
        };
        let mpirun = |n| Some(("OMPI_COMM_WORLD_SIZE", n));
        let ok = |a: JobArgs, l| a.check_with(l).is_ok();
        assert!(ok(args(None, Backend::Local), None));
        assert!(ok(args(Some(3), Backend::Tcp), None));
        assert!(!ok(args(Some(0), Backend::Local), None));
        assert!(!ok(args(Some(5000), Backend::Local), None));
        for b in [Backend::Local, Backend::Tcp] {
            let e = args(None, b)
                .check_with(mpirun(3))
                .err()
                .unwrap_or_default();
            assert!(e.contains("--backend mpi") && e.contains("=3"), "{e}");
            // One rank of mpirun runs as asked.
            assert!(ok(args(None, b), mpirun(1)));
        }
        if !cfg!(feature = "mpi") {
            // Without the feature, that comes first (before advice on
            // --ranks that could not be followed).
            let e = args(Some(2), Backend::Mpi)
                .check_with(mpirun(3))
                .err()
                .unwrap_or_default();
            assert!(e.contains("mpi feature"), "{e}");
            return;
        }
        assert!(ok(args(None, Backend::Mpi), mpirun(3)));
        assert!(ok(args(Some(3), Backend::Mpi), mpirun(3)));
        assert!(ok(args(Some(5000), Backend::Mpi), mpirun(5000)));
        let e = args(Some(2), Backend::Mpi)
            .check_with(mpirun(3))
            .err()
            .unwrap_or_default();
        assert!(e.contains("mpirun -np 2"), "{e}");
        // A singleton (no launcher) is one rank.
        assert!(ok(args(Some(1), Backend::Mpi), None));
        assert!(!ok(args(Some(4), Backend::Mpi), None));
    }

    #[test]
    fn size_names_are_exact() {
        assert_eq!(size_name(8), "8 B");
        assert_eq!(size_name(1500), "1500 B");
        assert_eq!(size_name(64 << 10), "64 KiB");
        assert_eq!(size_name(100_000), "100000 B");
        assert_eq!(size_name(1 << 20), "1 MiB");
        assert_eq!(size_name(1536 << 10), "1536 KiB");
        assert_eq!(size_name(2_000_000), "2000000 B");
    }

    #[test]
    fn median_of_odd_even_and_no_samples() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(Vec::new()).is_nan());
    }
}
