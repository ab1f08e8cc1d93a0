//! MPI benchmark (feature `mpi`): braid's `mpi` backend against raw MPI on
//! the same operations, in the same run, between 2 ranks, under the same
//! OpenMPI transport settings (shared memory, then TCP): streaming
//! bandwidth with 16 messages in flight (as osu_bw), and ping-pong.
//!
//! `braid-bench mpi` drives: it runs `mpirun -np 2 braid-bench mpi-rank`
//! (braid) and `mpirun -np 2 mpi_coll bw|pingpong` (raw MPI,
//! `bench/mpi_coll.c`) with the same sizes and iteration counts, then prints
//! the tables.

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
    /// `pingpong` or `bw`.
    #[arg(long)]
    op: String,
    /// `SIZE:ITERS` pairs.
    #[arg(long, value_delimiter = ',')]
    points: Vec<String>,
}

/// Messages in flight per iteration of the bandwidth test (as osu_bw and
/// `bench/mpi_coll.c`'s `bw`).
const WINDOW: usize = 16;

fn iters_for(size: usize, budget: usize) -> usize {
    (budget / size.max(1) / WINDOW).clamp(5, 5_000)
}

async fn one_iteration(
    comm: &Arc<dyn Communicator>,
    op: &str,
    tag: Tag,
    ack: Tag,
    msg: &Buffer,
) -> Result<(), BoxError> {
    match (op, comm.rank()) {
        ("bw", 0) => {
            let sends: Vec<_> = (0..WINDOW)
                .map(|_| comm.send(1, tag, msg.clone()))
                .collect();
            for s in sends {
                s.await?;
            }
            comm.recv(1, ack).await?;
        }
        ("bw", _) => {
            for _ in 0..WINDOW {
                comm.recv(0, tag).await?;
            }
            comm.send(0, ack, Buffer::from_vec(vec![0])).await?;
        }
        (_, 0) => {
            comm.send(1, tag, msg.clone()).await?;
            comm.recv(1, tag).await?;
        }
        _ => {
            let m = comm.recv(0, tag).await?;
            comm.send(0, tag, m).await?;
        }
    }
    Ok(())
}

/// One rank of the braid side (run under mpirun).
pub fn rank(args: MpiRankArgs) -> Result<(), BoxError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let comm: Arc<dyn Communicator> = Arc::new(braid_core::comm::mpi::MpiComm::init()?);
        let ctx = context_for(comm.clone(), MemoryLimits::UNLIMITED);
        if ctx.nranks() != 2 {
            return Err::<(), BoxError>("the MPI benchmark needs exactly 2 ranks".into());
        }
        for (k, p) in args.points.iter().enumerate() {
            let (s, i) = p.split_once(':').ok_or("points are SIZE:ITERS")?;
            let (size, iters): (usize, usize) = (s.parse()?, i.parse()?);
            let tag = Tag::new(OpId(100 + k as u32), 0);
            let ack = Tag::new(OpId(100 + k as u32), 1);
            let msg = Buffer::from_vec(vec![1u8; size]);
            // 5 warm-up iterations (connections, buffers), then the timed ones.
            for _ in 0..5 {
                one_iteration(&comm, &args.op, tag, ack, &msg).await?;
            }
            let t = Instant::now();
            for _ in 0..iters {
                one_iteration(&comm, &args.op, tag, ack, &msg).await?;
            }
            let per = if args.op == "bw" { WINDOW as f64 } else { 2.0 };
            if ctx.rank() == 0 {
                println!(
                    "RESULT bytes={size} us_per_iter={:.3}",
                    t.elapsed().as_secs_f64() * 1e6 / iters as f64 / per
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

/// Runs both sides for each transport and operation and prints the tables.
pub fn run(args: MpiArgs) -> Result<(), BoxError> {
    let mpi = super::coll::mpi_binary(&args.mpi)?;
    let me = std::env::current_exe()?;
    let points: Vec<(usize, usize)> = args
        .sizes
        .iter()
        .map(|s| (*s, iters_for(*s, args.bytes_per_point)))
        .collect();
    let list = points
        .iter()
        .map(|(s, i)| format!("{s}:{i}"))
        .collect::<Vec<_>>()
        .join(",");
    println!("# braid-bench mpi: braid's mpi backend vs raw MPI, 2 ranks");
    println!();
    println!(
        "bw: rank 0 sends {WINDOW} messages back to back, rank 1 receives them and acknowledges (as"
    );
    println!(
        "osu_bw); pingpong: one message there and back. Times are us per message, best of --reps"
    );
    println!("runs; x = braid bandwidth / MPI bandwidth (= MPI time / braid time).");
    for (name, btl) in [
        ("shared memory (self,vader)", "self,vader"),
        ("tcp (tcp,self)", "tcp,self"),
    ] {
        for op in ["bw", "pingpong"] {
            let mpirun = || {
                let mut c = Command::new("mpirun");
                c.args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
                    .args(["--mca", "pml", "ob1", "--mca", "btl", btl]);
                c
            };
            let mut braid = vec![f64::INFINITY; points.len()];
            let mut raw = vec![f64::INFINITY; points.len()];
            for _ in 0..args.reps {
                let bo = mpirun()
                    .arg(&me)
                    .args(["mpi-rank", "--op", op, "--points", &list])
                    .output()?;
                for (x, y) in braid
                    .iter_mut()
                    .zip(results(&bo, "braid over mpirun", points.len())?)
                {
                    *x = x.min(y);
                }
                let mo = mpirun().arg(&mpi).args([op, &list]).output()?;
                for (x, y) in raw.iter_mut().zip(results(&mo, "mpi_coll", points.len())?) {
                    *x = x.min(y);
                }
            }
            println!();
            println!("## {op}, {name}");
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
    }
    Ok(())
}
