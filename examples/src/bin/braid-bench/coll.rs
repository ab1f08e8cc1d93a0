//! Collective benchmark: every collective, 8 B to 64 MiB, 2 and 4 ranks,
//! braid's local and tcp backends next to OpenMPI (shared memory and TCP)
//! running the same operations in the same run (`bench/mpi_coll.c`, built
//! by `bench/install_mpi.sh`, which installs OpenMPI with apt if needed).
//!
//! MPI runs with `--oversubscribe` (4 ranks on a 2-core host need it; its
//! ranks then share cores, as braid's in-process ranks share threads).
//! Each point is the time per operation (max over ranks) after 5 warm-up
//! operations. The ratio columns are MPI time / braid time: above 1 means
//! braid is faster.
//!
//! Between in-process ranks some forms copy nothing: `bcast` and
//! `sendrecv` hand the buffer over, and the `_parts` forms return the
//! other ranks' data where it lies. MPI's processes must copy; the table
//! says which rows are such forms.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_coll::{
    AllToAllvSpec, Elements, ReduceKind, allreduce, allreduce_into, allreduce_parts, alltoall,
    alltoall_into, alltoallv, alltoallv_into, alltoallv_parts, barrier, broadcast, reduce_scatter,
    sendrecv,
};
use braid_core::comm::local::LocalComm;
use braid_core::comm::tcp::{TcpComm, TcpConfig};
use braid_core::launch::{LaunchError, LaunchSpec, OutputMode, launch};
use braid_core::world::{context_for, context_on};
use braid_core::{
    BoxError, Buffer, Communicator, Context, MemoryLimits, ProgressEngine, RankThreads,
};
use braid_core::{WorldSpec, run_world};
use braid_examples::{median, outln, size_name};

/// Options of `braid-bench coll`.
#[derive(Debug, clap::Args)]
pub struct CollArgs {
    /// The MPI baseline binary; built with bench/install_mpi.sh when absent.
    #[arg(long)]
    mpi: Option<PathBuf>,
    /// Message sizes in bytes (1 to 2^31 - 1: the MPI baseline counts
    /// bytes in a C int).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "8,1024,65536,1048576,16777216,67108864",
        value_parser = size_arg
    )]
    sizes: Vec<usize>,
    /// Rank counts.
    #[arg(long, value_delimiter = ',', default_value = "2,4", value_parser = clap::value_parser!(u32).range(1..))]
    ranks: Vec<u32>,
    /// Operations (barrier, bcast, allgather, allgather_into,
    /// allgather_parts, allgather_stream, allreduce, allreduce_into, allreduce_parts,
    /// reduce_scatter, alltoall, alltoall_into, alltoallv, alltoallv_into,
    /// alltoallv_parts, sendrecv). `allgather` is the one-shot call that
    /// returns one vector of every rank's values, as MPI_Allgather fills
    /// one; `allgather_stream` the streaming `AllGather` with one chunk
    /// per rank. The one-vector results (`allgather`, `allreduce`,
    /// `alltoall`, `alltoallv`) are fresh vectors per call; the `_into`
    /// forms write into one vector each rank keeps across the loop, as the
    /// MPI program writes into the receive buffer it keeps. The `_parts`
    /// forms are braid's piecewise result forms (no copy of other ranks'
    /// data in one process). Each is timed against the MPI call of the
    /// same kind.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "barrier,bcast,allgather,allgather_into,allgather_parts,allgather_stream,allreduce,allreduce_into,allreduce_parts,reduce_scatter,alltoall,alltoall_into,alltoallv,alltoallv_into,alltoallv_parts,sendrecv",
        value_parser = clap::builder::PossibleValuesParser::new(OPS)
    )]
    ops: Vec<String>,
    /// Bytes moved per point (bounds the iteration count).
    #[arg(long, default_value_t = 512 << 20)]
    bytes_per_point: usize,
    /// Runtime worker threads that carry braid's ranks; 0 runs every rank
    /// on one current-thread runtime (no cross-thread wake-ups: the lowest
    /// latency for in-process ranks, one core for all compute). Unset,
    /// local ranks run as `run_world` runs a job's (a runtime a rank where
    /// they fit the cores, else one shared with a worker a core) and tcp
    /// ranks as `--tcp-ranks` says.
    #[arg(long)]
    threads: Option<usize>,
    /// Where tcp ranks run when `--threads` is unset: `processes` (a
    /// process each, started as `braid-launch` starts a job's: what MPI's
    /// ranks are timed as), `own-runtime` (threads of this process, each
    /// rank on a runtime of its own as in a process) or `shared` (one
    /// runtime of 2 threads for all of them).
    #[arg(long, value_enum, default_value = "processes")]
    tcp_ranks: TcpRanks,
    /// Which braid worlds to time, each with its MPI baseline: `local`
    /// (against MPI shared memory) and `tcp` (against MPI over TCP). A
    /// world left out prints `-` in its columns.
    #[arg(long, value_delimiter = ',', default_value = "local,tcp")]
    worlds: Vec<World>,
    /// How a point's calls are timed, on both sides alike: `loop` (back
    /// to back, the loop's time over its calls) or `per-call` (each call
    /// alone after an untimed barrier, as the OSU benchmarks time
    /// collectives).
    #[arg(long, value_enum, default_value = "loop")]
    timing: Timing,
    /// Rounds per (operation, rank count, world): each times MPI and braid
    /// once, alternating which goes first. With more than one, braid and
    /// MPI are the medians of the rounds and x the median of the rounds'
    /// ratios, with its range: on a host whose rounds swing (a small VM,
    /// a busy one) one round's ratio says little.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
}

/// How a point's calls are timed (`--timing`). Back-to-back calls show
/// what a stream of calls sustains, where a call may overlap the next (a
/// broadcast's root that returns once its send is buffered runs ahead of
/// its peers); a call timed alone shows its latency, from its start on
/// ranks that start together to its return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Timing {
    /// The loop's time over its calls.
    Loop,
    /// The sum of the calls' own times, each after an untimed barrier.
    PerCall,
}

impl Timing {
    /// The option's value, as `coll-rank` takes it.
    fn arg(self) -> &'static str {
        match self {
            Timing::Loop => "loop",
            Timing::PerCall => "per-call",
        }
    }
}

/// Sizes as the MPI program rounds them, so both sides move the same bytes.
/// A `--sizes` entry: 1 to `i32::MAX` bytes (MPI counts a message's
/// bytes in a C int; 0 would be timed as the smallest size, 8 B).
pub(crate) fn size_arg(s: &str) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a size in bytes: {e}"))?;
    if n == 0 || n > i32::MAX as usize {
        return Err(format!(
            "{n} bytes: a size must be 1 to {} (MPI counts bytes in a C int)",
            i32::MAX
        ));
    }
    Ok(n)
}

pub(crate) fn used_bytes(op: &str, size: usize, n: usize) -> usize {
    match op {
        "barrier" => 0,
        "allreduce" | "allreduce_into" | "allreduce_parts" => (size / 8 * 8).max(8),
        "reduce_scatter" => (size / (8 * n) * 8 * n).max(8 * n),
        "alltoall" | "alltoall_into" | "alltoallv" | "alltoallv_into" | "alltoallv_parts" => {
            (size / n).max(1) * n
        }
        _ => size,
    }
}

/// Every operation the benchmark times.
pub(crate) const OPS: [&str; 16] = [
    "barrier",
    "bcast",
    "allgather",
    "allgather_into",
    "allgather_parts",
    "allgather_stream",
    "allreduce",
    "allreduce_into",
    "allreduce_parts",
    "reduce_scatter",
    "alltoall",
    "alltoall_into",
    "alltoallv",
    "alltoallv_into",
    "alltoallv_parts",
    "sendrecv",
];

/// Whether `op`'s result between in-process ranks is handed over or read
/// where it lies rather than copied (MPI's processes copy).
fn copies_nothing_in_process(op: &str) -> bool {
    matches!(op, "bcast" | "sendrecv") || op.ends_with("_parts")
}

/// Whether braid's form of `op` returns a new vector each call, where
/// MPI writes into a receive buffer it keeps (the row's note says so).
pub(crate) fn fresh_result(op: &str) -> bool {
    matches!(
        op,
        "allgather" | "allreduce" | "reduce_scatter" | "alltoall" | "alltoallv"
    )
}

/// The note under a [`fresh_result`] row's heading.
pub(crate) const FRESH_NOTE: &str = "(braid: a new vector each call, from 32 MiB a fresh mapping whose pages the kernel zeroes; MPI writes into a receive buffer it keeps, as braid's `_into` row does)";

/// Operations per point: `budget` bytes' worth, at least 5, at most 20000
/// (small points run for tens of milliseconds, long enough that the
/// first-point effects of a fresh runtime or process do not show).
fn iters_for(size: usize, budget: usize) -> usize {
    (budget / size.max(1)).clamp(5, 20_000)
}

/// What one operation gave, kept for [`check_op`] (the timed loop drops
/// it at once, as a caller done with it would).
pub(crate) enum Got {
    /// No result (barrier), or one written into the [`Input`]'s `out_*`
    /// vectors (the `_into` forms).
    Nothing,
    /// A buffer (bcast, sendrecv).
    Bytes(Buffer),
    /// One vector of bytes.
    U8(Vec<u8>),
    /// Bytes in parts, one per rank.
    U8Parts(Vec<Elements<u8>>),
    /// One vector of f64.
    F64(Vec<f64>),
    /// f64 in parts.
    F64Parts(Vec<Elements<f64>>),
    /// The streaming AllGather's chunks with their ranks, in (rank, seq)
    /// order.
    Chunks(Vec<(u32, Buffer)>),
}

/// One operation on one rank.
pub(crate) async fn run_op(
    ctx: &Context,
    op: &str,
    size: usize,
    input: &mut Input,
) -> Result<Got, BoxError> {
    let n = ctx.nranks();
    let me = ctx.rank();
    // AllToAllv's spec: equal blocks, as MPI_Alltoall's.
    let equal = || AllToAllvSpec::equal(n as usize, size / n as usize);
    Ok(match op {
        "barrier" => {
            barrier(ctx).await?;
            Got::Nothing
        }
        "bcast" => Got::Bytes(broadcast(ctx, 0, (me == 0).then(|| input.bytes.clone())).await?),
        "allgather" => Got::U8(braid_coll::allgather(ctx, input.u8s.clone()).await?),
        "allgather_into" => {
            braid_coll::allgather_into(ctx, input.u8s.clone(), &mut input.out_u8).await?;
            Got::Nothing
        }
        "allgather_parts" => {
            Got::U8Parts(braid_coll::allgather_parts(ctx, input.u8s.clone()).await?)
        }
        "allgather_stream" => Got::Chunks(allgather_stream(ctx, input.bytes.clone()).await?),
        "allreduce" => Got::F64(allreduce(ctx, input.f64s.clone(), ReduceKind::Sum).await?),
        "allreduce_into" => {
            allreduce_into(ctx, input.f64s.clone(), ReduceKind::Sum, &mut input.out_f64).await?;
            Got::Nothing
        }
        "allreduce_parts" => {
            Got::F64Parts(allreduce_parts(ctx, input.f64s.clone(), ReduceKind::Sum).await?)
        }
        "reduce_scatter" => {
            Got::F64(reduce_scatter(ctx, input.f64s.clone(), ReduceKind::Sum).await?)
        }
        "alltoall" => Got::U8(alltoall(ctx, input.u8s.clone()).await?),
        "alltoall_into" => {
            alltoall_into(ctx, input.u8s.clone(), &mut input.out_u8).await?;
            Got::Nothing
        }
        "alltoallv_into" => {
            alltoallv_into(ctx, input.u8s.clone(), equal(), &mut input.out_u8).await?;
            Got::Nothing
        }
        "alltoallv" => Got::U8(alltoallv(ctx, input.u8s.clone(), equal()).await?),
        "alltoallv_parts" => Got::U8Parts(alltoallv_parts(ctx, input.u8s.clone(), equal()).await?),
        "sendrecv" => {
            Got::Bytes(sendrecv(ctx, (me + 1) % n, input.bytes.clone(), (me + n - 1) % n).await?)
        }
        other => return Err(format!("unknown op {other}").into()),
    })
}

/// Byte `i` of rank `rank`'s input: a hash of both, so that a block
/// delivered to the wrong rank or place, or another rank's data, shows.
fn byte_of(rank: u32, i: usize) -> u8 {
    let x = (u64::from(rank) << 40) ^ i as u64;
    (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

/// Element `i` of rank `rank`'s f64 input: an integer below 2^20, so sums
/// over any rank count here are exact in every order.
fn f64_of(rank: u32, i: usize) -> f64 {
    let x = (u64::from(rank) << 40) ^ i as u64;
    (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 44) as f64
}

/// Runs `op` once more (untimed) and checks its result on this rank
/// against the closed form of every rank's input: a fast wrong answer
/// fails the benchmark instead of showing as a speed-up.
pub(crate) async fn check_op(
    ctx: &Context,
    op: &str,
    size: usize,
    input: &mut Input,
) -> Result<(), BoxError> {
    let (n, me) = (ctx.nranks(), ctx.rank());
    let got = run_op(ctx, op, size, input).await?;
    match correct(op, size, me, n, &got, input) {
        Some(true) => Ok(()),
        Some(false) => Err(format!(
            "braid-bench: rank {me}: {op} of {size} B on {n} ranks gave a wrong result (against every rank's input)"
        )
        .into()),
        None => Err(format!("braid-bench: no check for {op}").into()),
    }
}

/// Whether `got` (with `input`'s `out_*` vectors, for the `_into` forms)
/// is what `op` of `size` bytes must give rank `me` of `n` whose inputs
/// [`Input::new`] made; `None` where no check is written for the form.
fn correct(op: &str, size: usize, me: u32, n: u32, got: &Got, input: &Input) -> Option<bool> {
    // The bytes this rank must hold: every rank's input in rank order
    // (AllGather), or block `me` of every rank's input (AllToAll).
    let gathered = |r: u32, i: usize| byte_of(r, i);
    let blk = size / n as usize;
    let exchanged = |s: u32, j: usize| byte_of(s, me as usize * blk + j);
    let sum = |i: usize| (0..n).map(|r| f64_of(r, i)).sum::<f64>();
    let same_u8 = |got: &[u8], per: usize, f: &dyn Fn(u32, usize) -> u8| {
        got.len() == per * n as usize
            && got
                .chunks(per.max(1))
                .enumerate()
                .all(|(r, c)| c.iter().enumerate().all(|(i, b)| *b == f(r as u32, i)))
    };
    let u8_parts = |parts: &[Elements<u8>], per: usize, f: &dyn Fn(u32, usize) -> u8| {
        parts.len() == n as usize
            && parts.iter().enumerate().all(|(r, p)| {
                p.len() == per
                    && p.as_slice()
                        .iter()
                        .enumerate()
                        .all(|(i, b)| *b == f(r as u32, i))
            })
    };
    let reduced =
        |got: &[f64], from: usize| got.iter().enumerate().all(|(i, v)| *v == sum(from + i));
    let ok = match (op, got) {
        ("barrier", Got::Nothing) => true,
        ("bcast", Got::Bytes(b)) => {
            b.len() == size
                && b.as_slice()
                    .iter()
                    .enumerate()
                    .all(|(i, x)| *x == byte_of(0, i))
        }
        ("sendrecv", Got::Bytes(b)) => {
            let src = (me + n - 1) % n;
            b.len() == size
                && b.as_slice()
                    .iter()
                    .enumerate()
                    .all(|(i, x)| *x == byte_of(src, i))
        }
        ("allgather", Got::U8(v)) => same_u8(v, size, &gathered),
        ("allgather_into", Got::Nothing) => same_u8(&input.out_u8, size, &gathered),
        ("allgather_parts", Got::U8Parts(p)) => u8_parts(p, size, &gathered),
        ("allgather_stream", Got::Chunks(c)) => {
            c.len() == n as usize
                && c.iter().enumerate().all(|(r, (from, b))| {
                    *from == r as u32
                        && b.len() == size
                        && b.as_slice()
                            .iter()
                            .enumerate()
                            .all(|(i, x)| *x == byte_of(r as u32, i))
                })
        }
        ("allreduce", Got::F64(v)) => v.len() == size / 8 && reduced(v, 0),
        ("allreduce_into", Got::Nothing) => {
            input.out_f64.len() == size / 8 && reduced(&input.out_f64, 0)
        }
        ("allreduce_parts", Got::F64Parts(p)) => {
            let flat: Vec<f64> = p.iter().flat_map(|e| e.as_slice().to_vec()).collect();
            flat.len() == size / 8 && reduced(&flat, 0)
        }
        ("reduce_scatter", Got::F64(v)) => {
            let per = size / 8 / n as usize;
            v.len() == per && reduced(v, me as usize * per)
        }
        ("alltoall" | "alltoallv", Got::U8(v)) => same_u8(v, blk, &exchanged),
        ("alltoall_into" | "alltoallv_into", Got::Nothing) => {
            same_u8(&input.out_u8, blk, &exchanged)
        }
        ("alltoallv_parts", Got::U8Parts(p)) => u8_parts(p, blk, &exchanged),
        _ => return None,
    };
    Some(ok)
}

async fn allgather_stream(ctx: &Context, b: Buffer) -> Result<Vec<(u32, Buffer)>, BoxError> {
    let ag = braid_coll::AllGather::new(ctx, None);
    // One chunk per rank, as MPI_Allgather: it carries the rank's finish.
    ag.insert_last(
        0,
        braid_core::PackedData {
            metadata: Default::default(),
            data: b,
        },
    )?;
    Ok(ag
        .extract(braid_coll::ExtractOrder::RankSeq)
        .await?
        .into_iter()
        .map(|c| (c.rank, c.data.data))
        .collect())
}

/// One rank's buffers for one operation, allocated once per point (as the
/// MPI program allocates its own).
pub(crate) struct Input {
    bytes: Buffer,
    f64s: Elements<f64>,
    u8s: Elements<u8>,
    /// The `_into` forms' results, kept across the loop.
    out_f64: Vec<f64>,
    out_u8: Vec<u8>,
}

impl Input {
    /// Rank `rank`'s input to `op` at `size` bytes (each rank's differs,
    /// so that [`check_op`] sees whose data arrived where).
    pub(crate) fn new(op: &str, size: usize, rank: u32) -> Self {
        let f = if matches!(
            op,
            "allreduce" | "allreduce_into" | "allreduce_parts" | "reduce_scatter"
        ) {
            size / 8
        } else {
            0
        };
        let u = if matches!(
            op,
            "allgather"
                | "allgather_into"
                | "allgather_parts"
                | "alltoall"
                | "alltoall_into"
                | "alltoallv"
                | "alltoallv_into"
                | "alltoallv_parts"
        ) {
            size
        } else {
            0
        };
        let bytes_of = |len: usize| (0..len).map(|i| byte_of(rank, i)).collect::<Vec<u8>>();
        let b = if u == 0 && f == 0 { size } else { 0 };
        Input {
            bytes: Buffer::from_vec(bytes_of(b)),
            f64s: (0..f).map(|i| f64_of(rank, i)).collect::<Vec<_>>().into(),
            u8s: bytes_of(u).into(),
            out_f64: Vec::new(),
            out_u8: Vec::new(),
        }
    }
}

/// Times `iters` operations on every rank; returns the max over ranks.
/// One rank's part of a world's timing: every point in turn, each after 5
/// warm-up operations and a barrier, timed as `timing` says; returns the
/// time per operation by point.
async fn time_rank(
    ctx: Context,
    op: String,
    points: Vec<(usize, usize)>,
    timing: Timing,
) -> Result<Vec<Duration>, BoxError> {
    let mut per_op = Vec::with_capacity(points.len());
    for (size, iters) in points {
        // The MPI program allocates its rank's input once, too.
        let mut input = Input::new(&op, size, ctx.rank());
        for _ in 0..5 {
            run_op(&ctx, &op, size, &mut input).await?;
        }
        barrier(&ctx).await?;
        let took = match timing {
            Timing::Loop => {
                let t = Instant::now();
                for _ in 0..iters {
                    run_op(&ctx, &op, size, &mut input).await?;
                }
                t.elapsed()
            }
            Timing::PerCall => {
                let mut sum = Duration::ZERO;
                for _ in 0..iters {
                    barrier(&ctx).await?;
                    let t = Instant::now();
                    run_op(&ctx, &op, size, &mut input).await?;
                    sum += t.elapsed();
                }
                sum
            }
        };
        per_op.push(took / iters as u32);
        check_op(&ctx, &op, size, &mut input).await?;
        // As the MPI program (an MPI_Reduce of the times, then free): no
        // rank frees its input while another still times. In-process ranks
        // that share the runtime's workers: a rank woken by the last
        // operation can wait in the worker that runs a peer's teardown
        // (tokio's LIFO slot is not stolen): freeing 64 MiB there added
        // 7-13 ms to the last operation of the other rank.
        barrier(&ctx).await?;
        drop(input);
    }
    Ok(per_op)
}

/// Microseconds per operation by point: the slowest rank's.
fn slowest(per_rank: impl IntoIterator<Item = Vec<Duration>>, points: usize) -> Vec<f64> {
    let mut worst = vec![Duration::ZERO; points];
    for times in per_rank {
        for (w, t) in worst.iter_mut().zip(times) {
            *w = (*w).max(t);
        }
    }
    worst.iter().map(|d| d.as_secs_f64() * 1e6).collect()
}

/// `points` as the `SIZE:ITERS,...` argument the rank programs take.
pub(crate) fn points_arg(points: &[(usize, usize)]) -> String {
    points
        .iter()
        .map(|(s, i)| format!("{s}:{i}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs the MPI program for every size of one (op, ranks, transport);
/// returns microseconds per operation by size.
fn time_mpi(
    mpi: &PathBuf,
    op: &str,
    n: u32,
    shm: bool,
    points: &[(usize, usize)],
    timing: Timing,
) -> Result<Vec<f64>, BoxError> {
    let list = points_arg(points);
    let btl = if shm { "self,vader" } else { "tcp,self" };
    let mut cmd = mpirun(n, btl);
    if timing == Timing::PerCall {
        // (`-x`: every rank's environment, wherever mpirun starts it.)
        cmd.args(["-x", "MPI_COLL_TIMING=per-call"]);
    }
    let out = cmd
        .arg(mpi)
        .arg(match op {
            "alltoallv_parts" | "alltoallv_into" => "alltoallv",
            "alltoall_into" => "alltoall",
            "allgather_stream" | "allgather_parts" | "allgather_into" => "allgather",
            "allreduce_parts" | "allreduce_into" => "allreduce",
            other => other,
        })
        .arg(&list)
        .output()
        .map_err(|e| {
            format!("could not run mpirun ({e}): OpenMPI must be installed (bench/install_mpi.sh installs it with apt)")
        })?;
    if !out.status.success() {
        return Err(format!(
            "mpirun {op} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let us: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("RESULT"))
        .filter_map(|l| l.split("us_per_iter=").nth(1)?.trim().parse().ok())
        .collect();
    if us.len() != points.len() {
        return Err(format!(
            "mpirun {op}: expected {} results, got: {text}",
            points.len()
        )
        .into());
    }
    Ok(us)
}

/// `mpirun -np n` with Open MPI's ob1 over the byte transports `btl`
/// (`self,vader`: shared memory; `tcp,self`), oversubscribed. Root is
/// allowed through the variables that Open MPI 4 and 5 read (as
/// `--allow-run-as-root` does; a launcher of another MPI ignores them).
pub(crate) fn mpirun(n: u32, btl: &str) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "-np", &n.to_string()])
        .args(["--mca", "pml", "ob1", "--mca", "btl", btl])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c
}

/// The MPI baseline program: `given`, or the one bench/install_mpi.sh builds.
pub(crate) fn mpi_binary(given: &Option<PathBuf>) -> Result<PathBuf, BoxError> {
    if let Some(p) = given {
        return Ok(p.clone());
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bench/install_mpi.sh");
    let out = Command::new("bash").arg(&script).output()?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_default().trim().to_string();
    Ok(PathBuf::from(last))
}

/// Where the benchmark's tcp ranks run (`--tcp-ranks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum TcpRanks {
    /// One runtime of 2 threads for every rank.
    Shared,
    /// A runtime a rank, as `run_world` gives a tcp rank's process.
    OwnRuntime,
    /// A process a rank (`braid-bench coll-rank` under `braid_core::launch`).
    Processes,
}

/// Options of `braid-bench coll-rank`: one tcp rank of `coll
/// --tcp-ranks processes`, started by the launcher.
#[derive(Debug, clap::Args)]
pub struct CollRankArgs {
    /// The operation (see `CollArgs::ops`).
    #[arg(long)]
    op: String,
    /// `SIZE:ITERS` pairs.
    #[arg(long, value_delimiter = ',')]
    points: Vec<String>,
    /// How the calls are timed (see `CollArgs::timing`).
    #[arg(long, value_enum, default_value = "loop")]
    timing: Timing,
}

/// What a `coll-rank` process prints before its times (ns per operation,
/// one per point, comma-separated).
const RANK_TIMES: &str = "coll-rank ns:";

/// `braid-bench coll-rank`: times the points on this process's tcp rank
/// (as `run_world` runs it) and prints the times.
pub fn rank(args: CollRankArgs) -> Result<(), BoxError> {
    let mut points = Vec::with_capacity(args.points.len());
    for p in &args.points {
        let parsed = p
            .split_once(':')
            .and_then(|(s, i)| Some((s.parse::<usize>().ok()?, i.parse::<usize>().ok()?)));
        points.push(parsed.ok_or_else(|| format!("bad point {p:?}: expected SIZE:ITERS"))?);
    }
    let spec = WorldSpec::from_env_or_local(1)?;
    if !matches!(spec, WorldSpec::Tcp(_)) {
        return Err("coll-rank runs under the launcher (BRAID_* environment unset)".into());
    }
    let (op, timing) = (args.op, args.timing);
    let per_rank = run_world(&spec, MemoryLimits::UNLIMITED, move |ctx| {
        time_rank(ctx, op.clone(), points.clone(), timing)
    })?;
    for (_, times) in per_rank {
        let ns: Vec<String> = times.iter().map(|t| t.as_nanos().to_string()).collect();
        outln!("{RANK_TIMES} {}", ns.join(","));
    }
    Ok(())
}

/// Times `op` at every point on `n` tcp ranks in processes of their own,
/// started by the launcher as `braid-launch` starts them.
fn time_tcp_processes(
    n: u32,
    op: &str,
    points: &[(usize, usize)],
    timing: Timing,
) -> Result<Vec<f64>, BoxError> {
    let list = points_arg(points);
    let args = [
        "coll-rank",
        "--op",
        op,
        "--points",
        &list,
        "--timing",
        timing.arg(),
    ]
    .into_iter()
    .map(Into::into)
    .collect();
    let mut spec = LaunchSpec::new(n, std::env::current_exe()?, args);
    spec.output = OutputMode::Captured;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(launch(spec)).map_err(|e| match e {
        LaunchError::RankFailed { rank, report, .. } => format!(
            "tcp rank {rank} failed: {}",
            report.stderr.get(rank as usize).map_or("", |s| s.trim())
        ),
        e => e.to_string(),
    })?;
    let mut per_rank = Vec::with_capacity(n as usize);
    for (r, out) in report.stdout.iter().enumerate() {
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix(RANK_TIMES))
            .ok_or_else(|| format!("tcp rank {r} printed no times"))?;
        let times = line
            .split(',')
            .map(|t| t.trim().parse::<u64>().map(Duration::from_nanos))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("tcp rank {r}: bad times {line:?}: {e}"))?;
        if times.len() != points.len() {
            return Err(format!(
                "tcp rank {r}: {} times for {} points",
                times.len(),
                points.len()
            )
            .into());
        }
        per_rank.push(times);
    }
    Ok(slowest(per_rank, points.len()))
}

/// The transport of a braid world in this benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum World {
    /// In-process ranks (`LocalComm`).
    Local,
    /// Ranks talking over loopback TCP (`TcpComm`): as `--tcp-ranks`
    /// says, each in a process of its own (the default) or in this one.
    Tcp,
}

/// Builds an `n`-rank world on the current runtime, times `op` at every point
/// (us per operation), and shuts the world down.
async fn time_world(
    world: World,
    n: u32,
    op: &str,
    points: &[(usize, usize)],
    timing: Timing,
) -> Result<Vec<f64>, BoxError> {
    let comms: Vec<Arc<dyn Communicator>> = match world {
        World::Local => LocalComm::world(n)
            .into_iter()
            .map(|c| Arc::new(c) as Arc<dyn Communicator>)
            .collect(),
        World::Tcp => TcpComm::in_process_world(n)
            .await?
            .into_iter()
            .map(|c| Arc::new(c) as Arc<dyn Communicator>)
            .collect(),
    };
    let ctxs: Vec<Context> = comms
        .into_iter()
        .map(|c| context_for(c, MemoryLimits::UNLIMITED))
        .collect();
    let hs: Vec<_> = ctxs
        .iter()
        .map(|ctx| {
            tokio::spawn(time_rank(
                ctx.clone(),
                op.to_string(),
                points.to_vec(),
                timing,
            ))
        })
        .collect();
    let mut per_rank = Vec::with_capacity(hs.len());
    for (r, h) in hs.into_iter().enumerate() {
        let timed = match h.await {
            Ok(t) => t,
            Err(e) => Err(format!("rank {r} panicked: {e}").into()),
        };
        match timed {
            Ok(t) => per_rank.push(t),
            Err(e) => {
                // The others may wait for this rank in a collective:
                // they fail too, and the world ends.
                for c in &ctxs {
                    c.comm().abort(&e.to_string());
                }
                return Err(e);
            }
        }
    }
    let downs: Vec<_> = ctxs.iter().map(|c| c.comm().shutdown()).collect();
    for r in futures::future::join_all(downs).await {
        r?;
    }
    Ok(slowest(per_rank, points.len()))
}

/// Times `op` at every point on `n` in-process ranks started as jobs start
/// them (`braid_core::run_world`: a runtime a rank where they fit the
/// cores).
fn time_job_world(
    n: u32,
    op: &str,
    points: &[(usize, usize)],
    timing: Timing,
) -> Result<Vec<f64>, BoxError> {
    let (op, pts) = (op.to_string(), points.to_vec());
    let per_rank = run_world(
        &WorldSpec::Local { nranks: n },
        MemoryLimits::UNLIMITED,
        move |ctx| time_rank(ctx, op.clone(), pts.clone(), timing),
    )?;
    Ok(slowest(per_rank.into_iter().map(|(_, t)| t), points.len()))
}

/// Times `op` at every point on `n` tcp ranks of this process, each on a
/// runtime of its own as `run_world` gives a tcp rank's process (a worker
/// a core, at least 2): as `n` tcp ranks in processes of their own run,
/// which is what MPI's processes are timed as.
fn time_tcp_ranks(
    n: u32,
    op: &str,
    points: &[(usize, usize)],
    timing: Timing,
) -> Result<Vec<f64>, BoxError> {
    let root = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?;
    root.set_nonblocking(true)?;
    let addr = root.local_addr()?.to_string();
    let token = braid_core::comm::tcp::random_token();
    // What `run_world` gives a tcp rank's process (`tcp_rank_workers`): the
    // host's cores shared among its ranks, at least one.
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let workers = (cores / n as usize).max(1);
    let mut root = Some(root);
    let mut ranks = Vec::with_capacity(n as usize);
    for r in 0..n {
        let cfg = TcpConfig::new(r, n, addr.clone(), token.clone());
        let (listener, op, pts) = (root.take(), op.to_string(), points.to_vec());
        let rank = move || -> Result<Vec<Duration>, BoxError> {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .enable_all()
                .build()?;
            // As `run_world`: the rank is a task on a worker, its engine
            // `RankThreads::Own`.
            let engine = ProgressEngine::with_threads(rt.handle().clone(), RankThreads::Own);
            rt.block_on(rt.spawn(async move {
                let comm = match listener {
                    Some(l) => {
                        TcpComm::with_listener(cfg, tokio::net::TcpListener::from_std(l)?).await?
                    }
                    None => TcpComm::connect(cfg).await?,
                };
                let ctx = context_on(Arc::new(comm), MemoryLimits::UNLIMITED, engine);
                let timed = time_rank(ctx.clone(), op, pts, timing).await;
                if let Err(e) = &timed {
                    ctx.comm().abort(&e.to_string());
                }
                ctx.comm().shutdown().await?;
                timed
            }))?
        };
        ranks.push(
            std::thread::Builder::new()
                .name(format!("bench-tcp-{r}"))
                .spawn(rank)?,
        );
    }
    let mut per_rank = Vec::with_capacity(ranks.len());
    for (r, h) in ranks.into_iter().enumerate() {
        let timed = h
            .join()
            .map_err(|_| format!("tcp rank {r} panicked"))?
            .map_err(|e| format!("tcp rank {r}: {e}"))?;
        per_rank.push(timed);
    }
    Ok(slowest(per_rank, points.len()))
}

/// Runs the benchmark and prints one table per (operation, ranks).
pub fn run(args: CollArgs) -> Result<(), BoxError> {
    let mpi = mpi_binary(&args.mpi)?;
    let rt = match args.threads {
        Some(0) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        t => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(t.unwrap_or(2))
            .enable_all()
            .build()?,
    };
    let threads = match args.threads {
        None => format!(
            "local ranks in this process as run_world starts them, tcp ranks {}",
            match args.tcp_ranks {
                TcpRanks::Shared => "in this process on 2 runtime threads",
                TcpRanks::OwnRuntime => {
                    "in this process, each on a runtime of its own as in a process of its own"
                }
                TcpRanks::Processes => "each in a process of its own",
            }
        ),
        Some(0) => "every rank in this process on one current-thread runtime".to_string(),
        Some(t) => format!("every rank in this process on {t} runtime threads"),
    };
    outln!("# braid-bench coll: braid ({threads}) vs OpenMPI, same machine, same run");
    outln!();
    outln!(
        "Times are microseconds per operation (max over ranks), {}. x = MPI time / braid time (> 1: braid faster).",
        match args.timing {
            Timing::Loop => "calls back to back (the loop's time over its calls)",
            Timing::PerCall =>
                "each call timed alone after an untimed barrier (a call's latency, as the OSU benchmarks time collectives)",
        }
    );
    if args.rounds > 1 {
        outln!(
            "Each point: {} rounds, MPI and braid alternating which goes first; braid and MPI are the rounds' medians, x the median of the rounds' ratios (its range in brackets).",
            args.rounds
        );
    }
    for &n in &args.ranks {
        for op in &args.ops {
            let sizes: Vec<usize> = if op == "barrier" {
                vec![0]
            } else {
                let mut v: Vec<usize> = args
                    .sizes
                    .iter()
                    .map(|s| used_bytes(op, *s, n as usize))
                    .collect();
                v.dedup();
                v
            };
            let points: Vec<(usize, usize)> = sizes
                .iter()
                .map(|s| (*s, iters_for(*s * n as usize, args.bytes_per_point)))
                .collect();
            // One world at a time: only the ranks being timed exist, so a
            // waiting rank polls or parks as it would in a job of n ranks
            // (braid_core::Waiting counts the ranks a process hosts).
            let mut cols = Vec::new();
            for world in [World::Local, World::Tcp] {
                if !args.worlds.contains(&world) {
                    cols.push(None);
                    continue;
                }
                let timing = args.timing;
                let (mut braid_us, mut mpi_us) = (Vec::new(), Vec::new());
                for round in 0..args.rounds {
                    let mpi = || time_mpi(&mpi, op, n, world == World::Local, &points, timing);
                    let braid = || match (world, args.threads) {
                        (World::Local, None) => time_job_world(n, op, &points, timing),
                        (World::Tcp, None) if args.tcp_ranks == TcpRanks::OwnRuntime => {
                            time_tcp_ranks(n, op, &points, timing)
                        }
                        (World::Tcp, None) if args.tcp_ranks == TcpRanks::Processes => {
                            time_tcp_processes(n, op, &points, timing)
                        }
                        _ => rt.block_on(time_world(world, n, op, &points, timing)),
                    };
                    // Which side goes first alternates: a host that slows
                    // down or speeds up over a round's seconds weighs on
                    // both alike.
                    let (b, m) = if round % 2 == 0 {
                        let m = mpi()?;
                        (braid()?, m)
                    } else {
                        let b = braid()?;
                        (b, mpi()?)
                    };
                    braid_us.push(b);
                    mpi_us.push(m);
                }
                cols.push(Some((braid_us, mpi_us)));
            }
            outln!();
            outln!("## {op}, {n} ranks");
            if copies_nothing_in_process(op) && args.worlds.contains(&World::Local) {
                outln!();
                outln!(
                    "(braid local: the ranks' data is handed over or read where it lies, not copied; MPI's processes copy it)"
                );
            }
            if fresh_result(op) {
                outln!();
                outln!("{FRESH_NOTE}");
            }
            outln!();
            outln!("| size | braid local | MPI shm | x | braid tcp | MPI tcp | x |");
            outln!("|---:|---:|---:|---:|---:|---:|---:|");
            for (k, (size, _)) in points.iter().enumerate() {
                let mut row = format!("| {} |", size_name(*size));
                for col in &cols {
                    match col {
                        Some((b, m)) => row += &cell(b, m, k),
                        None => row += " - | - | - |",
                    }
                }
                outln!("{row}");
            }
        }
    }
    Ok(())
}

/// One world's three cells of point `k` from the rounds' times (`b`:
/// braid's per round, `m`: MPI's): braid and MPI as their medians, x as
/// the median of the rounds' MPI / braid, and where there are several
/// rounds, x's range after it.
fn cell(b: &[Vec<f64>], m: &[Vec<f64>], k: usize) -> String {
    let at = |t: &[Vec<f64>]| t.iter().map(|r| r[k]).collect::<Vec<f64>>();
    let (bs, ms) = (at(b), at(m));
    let xs: Vec<f64> = ms.iter().zip(&bs).map(|(m, b)| m / b).collect();
    let (lo, hi) = xs
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, z), v| {
            (a.min(*v), z.max(*v))
        });
    let range = if xs.len() > 1 {
        format!(" ({lo:.2}-{hi:.2})")
    } else {
        String::new()
    };
    format!(
        " {:.2} | {:.2} | {:.2}{range} |",
        median(bs),
        median(ms),
        median(xs)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cell is the medians of the rounds and the median of their
    /// ratios (not the ratio of the medians), with the ratios' range
    /// where there are several rounds.
    #[test]
    fn a_cell_takes_medians_over_rounds() {
        // Two points, three rounds; point 1's ratios: 4/2, 9/3, 1/1.
        let b = vec![vec![1.0, 2.0], vec![5.0, 3.0], vec![7.0, 1.0]];
        let m = vec![vec![2.0, 4.0], vec![5.0, 9.0], vec![3.5, 1.0]];
        assert_eq!(cell(&b, &m, 1), " 2.00 | 4.00 | 2.00 (1.00-3.00) |");
        assert_eq!(cell(&b, &m, 0), " 5.00 | 3.50 | 1.00 (0.50-2.00) |");
        assert_eq!(cell(&b[..1], &m[..1], 1), " 2.00 | 4.00 | 2.00 |");
    }

    /// Both timings time every point of every rank (3 in-process ranks,
    /// two points), and each point's results pass the value check that
    /// `time_rank` runs after its loop (an error otherwise).
    #[test]
    fn both_timings_time_every_point_and_check_it() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        for timing in [Timing::Loop, Timing::PerCall] {
            for op in ["bcast", "allreduce", "alltoallv"] {
                let us = rt
                    .block_on(time_world(
                        World::Local,
                        3,
                        op,
                        &[(24, 3), (3000, 2)],
                        timing,
                    ))
                    .unwrap();
                assert_eq!(us.len(), 2, "{op} {timing:?}");
                assert!(
                    us.iter().all(|t| t.is_finite() && *t > 0.0),
                    "{op} {timing:?}: {us:?}"
                );
            }
        }
        assert_eq!(Timing::PerCall.arg(), "per-call");
        assert_eq!(
            <Timing as clap::ValueEnum>::from_str(Timing::PerCall.arg(), false),
            Ok(Timing::PerCall)
        );
    }

    /// Every form's check passes on what the collective gives (3
    /// in-process ranks, sizes that do and do not split evenly), and
    /// fails once one byte or element of the result is changed.
    #[test]
    fn the_checks_take_right_results_and_refuse_wrong_ones() {
        let n = 3u32;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        rt.block_on(async {
            let ctxs: Vec<Context> = LocalComm::world(n)
                .into_iter()
                .map(|c| context_for(Arc::new(c), MemoryLimits::UNLIMITED))
                .collect();
            for op in OPS {
                for size in [8usize, 1000, 70_000] {
                    let size = used_bytes(op, size, n as usize);
                    let hs: Vec<_> = ctxs
                        .iter()
                        .map(|ctx| {
                            let ctx = ctx.clone();
                            tokio::spawn(async move {
                                let mut input = Input::new(op, size, ctx.rank());
                                let got = run_op(&ctx, op, size, &mut input)
                                    .await
                                    .unwrap_or_else(|e| panic!("{op} {size}: {e}"));
                                let me = ctx.rank();
                                assert_eq!(
                                    correct(op, size, me, n, &got, &input),
                                    Some(true),
                                    "{op} {size} rank {me}"
                                );
                                if op == "barrier" {
                                    return;
                                }
                                // One value changed: refused.
                                let (got, input) = spoil(got, input);
                                assert_eq!(
                                    correct(op, size, me, n, &got, &input),
                                    Some(false),
                                    "{op} {size} rank {me}: a changed result passed"
                                );
                            })
                        })
                        .collect();
                    for h in hs {
                        h.await.unwrap_or_else(|e| panic!("{e}"));
                    }
                }
            }
            let downs = ctxs.iter().map(|c| c.comm().shutdown());
            for r in futures::future::join_all(downs).await {
                r.unwrap_or_else(|e| panic!("{e}"));
            }
        });
    }

    /// The result with its last byte (or element) changed.
    fn spoil(got: Got, mut input: Input) -> (Got, Input) {
        fn bump_u8(v: &mut [u8]) {
            if let Some(x) = v.last_mut() {
                *x = x.wrapping_add(1);
            }
        }
        fn bump_f64(v: &mut [f64]) {
            if let Some(x) = v.last_mut() {
                *x += 1.0;
            }
        }
        let bytes = |b: &Buffer| {
            let mut v = b.as_slice().to_vec();
            bump_u8(&mut v);
            Buffer::from_vec(v)
        };
        let got = match got {
            Got::Nothing => {
                bump_u8(&mut input.out_u8);
                bump_f64(&mut input.out_f64);
                Got::Nothing
            }
            Got::Bytes(b) => Got::Bytes(bytes(&b)),
            Got::U8(mut v) => {
                bump_u8(&mut v);
                Got::U8(v)
            }
            Got::F64(mut v) => {
                bump_f64(&mut v);
                Got::F64(v)
            }
            Got::U8Parts(mut p) => {
                if let Some(last) = p.last_mut() {
                    let mut v = last.as_slice().to_vec();
                    bump_u8(&mut v);
                    *last = v.into();
                }
                Got::U8Parts(p)
            }
            Got::F64Parts(mut p) => {
                if let Some(last) = p.iter_mut().rev().find(|e| !e.is_empty()) {
                    let mut v = last.as_slice().to_vec();
                    bump_f64(&mut v);
                    *last = v.into();
                }
                Got::F64Parts(p)
            }
            Got::Chunks(mut c) => {
                if let Some((_, b)) = c.last_mut() {
                    *b = bytes(b);
                }
                Got::Chunks(c)
            }
        };
        (got, input)
    }
}
