//! `braid-bench`: benchmark driver. Each subcommand measures braid next to
//! a baseline measured in the same run and prints a table of ratios.
//!
//! - `comm`: point-to-point latency and bandwidth, 2 ranks, local and tcp,
//!   against a raw tokio TCP socket pair.
//! - `mpi` (feature `mpi`): braid's mpi backend against raw MPI.
//!   Subcommands whose feature a build lacks say so when asked for.
//! - `rolling`: the rolling job against Polars on 10 million rows.
//! - `gpu` (feature `cuda`): device collectives against raw NCCL, and the
//!   copy-engine IPC SendRecv against NCCL send/recv.
//! - `gpu-sort`, `gpu-rolling` (feature `cuda`): the radix sort (compare
//!   `bench/torch_sort.py`) and the rolling kernel against a device copy.
//! - `coll`: every collective, 2 and 4 ranks, local and tcp, against
//!   OpenMPI (shared memory and TCP).

mod coll;
mod comm;
#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "cuda")]
mod gpu_rolling;
#[cfg(feature = "cuda")]
mod gpu_sort;
#[cfg(feature = "mpi")]
mod mpi;
mod rolling;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// braid benchmark driver.
#[derive(Debug, Parser)]
#[command(name = "braid-bench", version)]
struct Cli {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// Point-to-point latency (8 B) and bandwidth (1 KiB to 256 MiB).
    Comm(comm::CommArgs),
    /// Every collective, 8 B to 64 MiB, 2 and 4 ranks, vs OpenMPI.
    Coll(coll::CollArgs),
    /// The rolling job vs Polars, Parquet in and out, 10M rows.
    Rolling(rolling::RollingArgs),
    /// Device collectives vs raw NCCL, 1 KiB to 1 GiB (feature cuda).
    #[cfg(feature = "cuda")]
    Gpu(gpu::GpuArgs),
    /// GPU radix sort of 100M i64 keys (feature cuda; compare bench/torch_sort.py).
    #[cfg(feature = "cuda")]
    GpuSort(gpu_sort::GpuSortArgs),
    /// GPU rolling kernel vs device-to-device copy bandwidth (feature cuda).
    #[cfg(feature = "cuda")]
    GpuRolling(gpu_rolling::GpuRollingArgs),
    /// One tcp rank of `coll --tcp-ranks processes` (run by `coll`).
    #[command(hide = true)]
    CollRank(coll::CollRankArgs),
    /// braid's mpi backend vs raw MPI (feature mpi).
    #[cfg(feature = "mpi")]
    Mpi(mpi::MpiArgs),
    /// One rank of the MPI benchmark (run by `mpi` under mpirun).
    #[cfg(feature = "mpi")]
    #[command(hide = true)]
    MpiRank(mpi::MpiRankArgs),
    /// `mpi` on a build without the feature: says so.
    #[cfg(not(feature = "mpi"))]
    #[command(hide = true)]
    Mpi(Unbuilt),
    /// `gpu` on a build without the feature: says so.
    #[cfg(not(feature = "cuda"))]
    #[command(hide = true)]
    Gpu(Unbuilt),
    /// `gpu-sort` on a build without the feature: says so.
    #[cfg(not(feature = "cuda"))]
    #[command(hide = true)]
    GpuSort(Unbuilt),
    /// `gpu-rolling` on a build without the feature: says so.
    #[cfg(not(feature = "cuda"))]
    #[command(hide = true)]
    GpuRolling(Unbuilt),
}

/// The arguments of a subcommand this build lacks, taken as they come.
#[cfg(not(all(feature = "mpi", feature = "cuda")))]
#[derive(Debug, clap::Args)]
struct Unbuilt {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    _rest: Vec<String>,
}

/// The error for a subcommand whose feature this build lacks.
#[cfg(not(all(feature = "mpi", feature = "cuda")))]
fn unbuilt(what: &str, feature: &str) -> Result<(), braid_core::BoxError> {
    Err(format!(
        "`braid-bench {what}` needs a build with the {feature} feature (cargo build --release --bin braid-bench --features braid-examples/{feature})"
    )
    .into())
}

fn main() -> ExitCode {
    braid_examples::init_tracing();
    let cli = Cli::parse();
    // As `run_world` does for in-process and tcp ranks (not under MPI).
    if matches!(cli.what, What::Comm(_) | What::Coll(_) | What::Rolling(_)) {
        braid_core::memory::reuse_freed_memory();
    }
    let res = match cli.what {
        What::Comm(a) => comm::run(a),
        What::Coll(a) => coll::run(a),
        What::CollRank(a) => coll::rank(a),
        What::Rolling(a) => rolling::run(a),
        #[cfg(feature = "cuda")]
        What::Gpu(a) => gpu::run(a),
        #[cfg(feature = "cuda")]
        What::GpuSort(a) => gpu_sort::run(a),
        #[cfg(feature = "cuda")]
        What::GpuRolling(a) => gpu_rolling::run(a),
        #[cfg(feature = "mpi")]
        What::Mpi(a) => mpi::run(a),
        #[cfg(feature = "mpi")]
        What::MpiRank(a) => mpi::rank(a),
        #[cfg(not(feature = "mpi"))]
        What::Mpi(_) => unbuilt("mpi", "mpi"),
        #[cfg(not(feature = "cuda"))]
        What::Gpu(_) => unbuilt("gpu", "cuda"),
        #[cfg(not(feature = "cuda"))]
        What::GpuSort(_) => unbuilt("gpu-sort", "cuda"),
        #[cfg(not(feature = "cuda"))]
        What::GpuRolling(_) => unbuilt("gpu-rolling", "cuda"),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            braid_examples::errln!("error: {e}");
            braid_core::world::exit_code(&*e)
        }
    }
}
