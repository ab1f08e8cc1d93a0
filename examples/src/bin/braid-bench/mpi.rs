//! MPI benchmark (feature `mpi`): braid's `mpi` backend against raw MPI on
//! the same operation, in the same run: a ping-pong between 2 ranks (one-way
//! time = round trip / 2, bandwidth = size / one-way time), under the same
//! OpenMPI transport settings (shared memory, then TCP).
//!
//! `braid-bench mpi` drives: it runs `mpirun -np 2 braid-bench mpi-rank`
//! (braid) and `mpirun -np 2 mpi_coll pingpong` (raw MPI, `bench/mpi_coll.c`)
//! with the same sizes and iteration counts, then prints the table.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use braid_core::world::context_for;
use braid_core::{BoxError, Buffer, Communicator, MemoryLimits, OpId, Tag};
use braid_examples::size_name;

/// Options of `braid-bench mpi`.
#[derive(Debug, Clone, clap::Args)]
pub struct MpiArgs {
    /// The MPI baseline binary; built with bench/install_mpi.sh when absent.
    #[arg(long)]
    mpi: Option<PathBuf>,
    /// Message sizes in bytes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "8,1024,65536,1048576,16777216,67108864"
    )]
    sizes: Vec<usize>,
    /// Bytes moved per point (bounds the iteration count).
    #[arg(long, default_value_t = 1 << 30)]
    bytes_per_point: usize,
    /// Runs of each side; the best time per point is kept.
    #[arg(long, default_value_t = 3)]
    reps: u32,
}

/// Options of the hidden per-rank subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct MpiRankArgs {
    /// `SIZE:ITERS` pairs.
    #[arg(long, value_delimiter = ',')]
    points: Vec<String>,
}

fn iters_for(size: usize, budget: usize) -> usize {
    (budget / size.max(1)).clamp(10, 10_000)
}

/// One rank of the braid ping-pong (run under mpirun).
pub fn rank(args: MpiRankArgs) -> Result<(), BoxError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let comm: Arc<dyn Communicator> = Arc::new(braid_core::comm::mpi::MpiComm::init()?);
        let ctx = context_for(comm.clone(), MemoryLimits::UNLIMITED);
        if ctx.nranks() != 2 {
            return Err::<(), BoxError>("the MPI ping-pong needs exactly 2 ranks".into());
        }
        let me = ctx.rank();
        for (k, p) in args.points.iter().enumerate() {
            let (s, i) = p.split_once(':').ok_or("points are SIZE:ITERS")?;
            let (size, iters): (usize, usize) = (s.parse()?, i.parse()?);
            let tag = Tag::new(OpId(100 + k as u32), 0);
            let msg = Buffer::from_vec(vec![1u8; size]);
            let mut elapsed = 0.0;
            for round in 0..2 {
                // Round 0 warms up (connections, buffers).
                let n = if round == 0 { 5 } else { iters };
                let t = Instant::now();
                for _ in 0..n {
                    if me == 0 {
                        comm.send(1, tag, msg.clone()).await?;
                        comm.recv(1, tag).await?;
                    } else {
                        let m = comm.recv(0, tag).await?;
                        comm.send(0, tag, m).await?;
                    }
                }
                elapsed = t.elapsed().as_secs_f64();
            }
            if me == 0 {
                println!(
                    "RESULT bytes={size} us_per_iter={:.3}",
                    elapsed * 1e6 / iters as f64 / 2.0
                );
            }
        }
        comm.shutdown().await?;
        Ok(())
    })
}

fn results(out: &std::process::Output, what: &str, n: usize) -> Result<Vec<f64>, BoxError> {
    if !out.status.success() {
        return Err(format!("{what} failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("RESULT"))
        .filter_map(|l| l.split("us_per_iter=").nth(1)?.trim().parse().ok())
        .collect();
    if v.len() != n {
        return Err(format!("{what}: expected {n} results, got:\n{text}").into());
    }
    Ok(v)
}

/// Runs both sides for each transport and prints the table.
pub fn run(args: MpiArgs) -> Result<(), BoxError> {
    let mpi = super::coll::mpi_binary(&args.mpi)?;
    let me = std::env::current_exe()?;
    let points: Vec<(usize, usize)> = args
        .sizes
        .iter()
        .map(|s| (*s, iters_for(*s, args.bytes_per_point)))
        .collect();
    let list: Vec<String> = points.iter().map(|(s, i)| format!("{s}:{i}")).collect();
    println!("# braid-bench mpi: braid's mpi backend vs raw MPI, ping-pong between 2 ranks");
    println!();
    println!(
        "One-way time in us (round trip / 2), best of --reps runs; x = braid bandwidth / MPI bandwidth."
    );
    for (name, btl) in [
        ("shared memory (self,vader)", "self,vader"),
        ("tcp (tcp,self)", "tcp,self"),
    ] {
        let base = |c: &mut Command| {
            c.args([
                "--allow-run-as-root",
                "--oversubscribe",
                "-np",
                "2",
                "--mca",
                "pml",
                "ob1",
                "--mca",
                "btl",
                btl,
            ]);
        };
        // Best of `reps` runs of each side, alternating, per point.
        let mut braid = vec![f64::INFINITY; points.len()];
        let mut raw = vec![f64::INFINITY; points.len()];
        for _ in 0..args.reps {
            let mut b = Command::new("mpirun");
            base(&mut b);
            let bo = b
                .arg(&me)
                .args(["mpi-rank", "--points", &list.join(",")])
                .output()?;
            for (x, y) in braid
                .iter_mut()
                .zip(results(&bo, "braid over mpirun", points.len())?)
            {
                *x = x.min(y);
            }
            let mut m = Command::new("mpirun");
            base(&mut m);
            let mo = m.arg(&mpi).args(["pingpong", &list.join(",")]).output()?;
            for (x, y) in raw.iter_mut().zip(results(&mo, "mpi_coll", points.len())?) {
                *x = x.min(y);
            }
        }
        println!();
        println!("## {name}");
        println!();
        println!("| size | braid us | MPI us | braid GB/s | MPI GB/s | x |");
        println!("|---:|---:|---:|---:|---:|---:|");
        for (k, (size, _)) in points.iter().enumerate() {
            let gbs = |us: f64| *size as f64 / us / 1e3;
            println!(
                "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                size_name(*size),
                braid[k],
                raw[k],
                gbs(braid[k]),
                gbs(raw[k]),
                raw[k] / braid[k]
            );
        }
    }
    Ok(())
}
