//! Shared plumbing of braid's runnable jobs: the `--ranks`/`--backend`
//! options every example takes, and starting the job on them.
//!
//! With `--backend local` every rank is a task of this process. With
//! `--backend tcp` this process becomes the launcher: it starts `--ranks`
//! copies of itself with the rank environment set (see
//! `braid_core::launch`), and each copy runs one rank.

use std::future::Future;

use braid_core::comm::tcp::TcpConfig;
use braid_core::launch::{LaunchSpec, launch};
use braid_core::{Backend, BoxError, Context, MemoryLimits, Rank, WorldSpec};

/// Options shared by every example.
#[derive(Debug, Clone, clap::Args)]
pub struct JobArgs {
    /// Number of ranks.
    #[arg(long, default_value_t = 4)]
    pub ranks: u32,
    /// How ranks talk: `local` (threads of this process), `tcp` (one
    /// process per rank on this host) or `mpi` (ranks started by mpirun or
    /// srun; needs the `mpi` feature).
    #[arg(long, default_value = "local")]
    pub backend: Backend,
}

/// The most ranks `--ranks` starts on one host (tasks or processes); more
/// would only exhaust its memory and threads.
pub const MAX_HOST_RANKS: u32 = 1024;

impl JobArgs {
    /// Checks `--ranks` before any work (under MPI the launcher decides).
    pub fn check(&self) -> Result<(), String> {
        if self.ranks == 0 {
            return Err("--ranks must be at least 1".into());
        }
        if self.backend != Backend::Mpi && self.ranks > MAX_HOST_RANKS {
            return Err(format!(
                "--ranks {} is more than the {MAX_HOST_RANKS} ranks one host runs (--backend {})",
                self.ranks, self.backend
            ));
        }
        Ok(())
    }
}

/// Installs a tracing subscriber reading `RUST_LOG` (default: warnings).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
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

/// A byte count for tables: `8 B`, `64 KiB`, `16 MiB`.
pub fn size_name(s: usize) -> String {
    if s >= 1 << 20 {
        format!("{} MiB", s >> 20)
    } else if s >= 1 << 10 {
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
    args.check()?;
    let spec = match (args.backend, TcpConfig::from_env()?) {
        #[cfg(feature = "mpi")]
        (Backend::Mpi, _) => WorldSpec::Mpi,
        #[cfg(not(feature = "mpi"))]
        (Backend::Mpi, _) => {
            return Err("--backend mpi needs a build with the mpi feature (cargo build --release --features mpi), started by mpirun or srun".into());
        }
        (_, Some(cfg)) => WorldSpec::Tcp(cfg),
        (Backend::Local, None) => WorldSpec::Local { nranks: args.ranks },
        (Backend::Tcp, None) => {
            let exe = std::env::current_exe()?;
            let argv: Vec<_> = std::env::args_os().skip(1).collect();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(launch(LaunchSpec::new(args.ranks, exe, argv)))?;
            return Ok(JobOutcome::Launched);
        }
    };
    Ok(JobOutcome::Ran(braid_core::run_world(&spec, limits, job)?))
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_no_samples() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(Vec::new()).is_nan());
    }
}
