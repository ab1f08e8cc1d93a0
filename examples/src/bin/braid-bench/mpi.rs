//! MPI benchmark (feature `mpi`): braid's `mpi` backend against raw MPI on
//! the same operations, under the same OpenMPI transport settings (shared
//! memory, then TCP): between 2 ranks streaming bandwidth with 16 messages
//! in flight (as osu_bw) and ping-pong; with `--ops`, braid's collectives
//! against MPI's own (`MPI_Allreduce`, `MPI_Alltoall`, ...) on 2 and 4
//! ranks.
//!
//! `braid-bench mpi` drives: it runs `mpirun -np 2 braid-bench mpi-rank`,
//! in which each rank alternates rounds of raw MPI calls (rsmpi's thin
//! wrappers, through [`MpiComm::with_world`]) with rounds of the same
//! operations through braid, in one process: both sides see the same
//! placement, memory and moment of a noisy host (separate launches differ
//! by 2-3x at 1 MiB on a shared VM, which hid the gap being measured). It
//! also runs `mpirun -np N mpi_coll OP` (`bench/mpi_coll.c`, a separate
//! C program) as a cross-check of the in-process baseline. A rank of a
//! collective run prints its statistics (bytes received in place among
//! them) to stderr when `BRAID_BENCH_STATS` is set.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use braid_core::comm::mpi::MpiComm;
use braid_core::world::context_for;
use braid_core::{BoxError, Buffer, Communicator, Context, MemoryLimits, OpId, Tag};
use braid_examples::{median, outln, size_name};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives, Destination, Root, Source};

use super::coll::{Input, check_op, run_op, size_arg, used_bytes};

/// Options of `braid-bench mpi`.
#[derive(Debug, Clone, clap::Args)]
pub struct MpiArgs {
    /// The MPI baseline binary; built with bench/install_mpi.sh when absent.
    #[arg(long)]
    mpi: Option<PathBuf>,
    /// Message sizes in bytes (1 to 2^31 - 1: MPI counts bytes in a C
    /// int).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "8,1024,65536,1048576,16777216,67108864",
        value_parser = size_arg
    )]
    sizes: Vec<usize>,
    /// Bytes moved per point and side in each round (bounds the iteration
    /// count).
    #[arg(long, default_value_t = 1 << 28)]
    bytes_per_point: usize,
    /// Alternated rounds (raw MPI, then braid, or the other way) per point.
    #[arg(long, default_value_t = 9, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Runs of the separate C program (`mpi_coll`); its best time per
    /// point is shown for reference. 0 skips it.
    #[arg(long, default_value_t = 3)]
    reps: u32,
    /// Operations: `bw` and `pingpong` (point-to-point, 2 ranks), and the
    /// collectives `barrier`, `bcast`, `allgather` (a fresh vector),
    /// `allgather_into`, `allgather_parts` (one buffer a rank, each
    /// received on its own), `allreduce_into`,
    /// `reduce_scatter`, `alltoall_into`, `alltoallv_into`, `sendrecv`
    /// (as in `braid-bench coll`; the `_into` forms write into a vector
    /// kept across the loop, as MPI writes into its receive buffer).
    #[arg(long, value_delimiter = ',', default_value = "bw,pingpong")]
    ops: Vec<String>,
    /// Rank counts for the collectives (point-to-point runs on 2).
    #[arg(long, value_delimiter = ',', default_value = "2,4", value_parser = clap::value_parser!(u32).range(1..))]
    ranks: Vec<u32>,
}

/// Options of the hidden per-rank subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct MpiRankArgs {
    /// `pingpong`, `bw` or a collective (see `MpiArgs::ops`).
    #[arg(long)]
    op: String,
    /// `SIZE:ITERS` pairs.
    #[arg(long, value_delimiter = ',')]
    points: Vec<String>,
    /// Alternated rounds per point.
    #[arg(long, default_value_t = 9, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
}

/// Messages in flight per iteration of the bandwidth test (as osu_bw and
/// `bench/mpi_coll.c`'s `bw`).
const WINDOW: usize = 16;

/// Raw MPI's tags: braid's own are `(op << 8) | stage` with op >= 100 here,
/// so these never match a braid message.
const RAW_TAG: i32 = 1;
const RAW_ACK: i32 = 2;

/// The collectives this benchmark times (their names as in `braid-bench
/// coll`).
const COLLS: [&str; 10] = [
    "barrier",
    "bcast",
    "allgather",
    "allgather_into",
    "allgather_parts",
    "allreduce_into",
    "reduce_scatter",
    "alltoall_into",
    "alltoallv_into",
    "sendrecv",
];

/// Iterations of one round at a point of `size` bytes a rank (`n` ranks).
fn iters_for(op: Op, size: usize, n: usize, budget: usize) -> usize {
    match op {
        Op::Bw | Op::PingPong => (budget / size.max(1) / WINDOW).clamp(5, 5_000),
        // Up to 2000: 9 rounds of both sides stay within seconds at 8 B.
        Op::Coll(_) => (budget / (size * n).max(1)).clamp(5, 2_000),
    }
}

/// The benchmark's operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `WINDOW` messages from rank 0 to rank 1, then a 1-byte ack.
    Bw,
    /// One message there and back.
    PingPong,
    /// One collective call on every rank (a name from [`COLLS`]).
    Coll(&'static str),
}

impl Op {
    fn parse(s: &str) -> Result<Op, BoxError> {
        match s {
            "bw" => Ok(Op::Bw),
            "pingpong" => Ok(Op::PingPong),
            _ => COLLS
                .iter()
                .find(|c| **c == s)
                .map(|c| Op::Coll(c))
                .ok_or_else(|| {
                    format!("unknown op {s:?} (bw, pingpong, {})", COLLS.join(", ")).into()
                }),
        }
    }

    /// Messages per iteration that one reported time covers.
    fn per_iteration(self) -> f64 {
        match self {
            Op::Bw => WINDOW as f64,
            Op::PingPong => 2.0,
            Op::Coll(_) => 1.0,
        }
    }

    /// The name `bench/mpi_coll.c` knows the operation by.
    fn c_name(self) -> &'static str {
        match self {
            Op::Bw => "bw",
            Op::PingPong => "pingpong",
            Op::Coll("allgather_into" | "allgather_parts") => "allgather",
            Op::Coll("allreduce_into") => "allreduce",
            Op::Coll("alltoall_into") => "alltoall",
            Op::Coll("alltoallv_into") => "alltoallv",
            Op::Coll(c) => c,
        }
    }
}

/// Raw MPI's buffers for one collective point (as `bench/mpi_coll.c`'s).
struct RawBufs {
    send: Vec<u8>,
    recv: Vec<u8>,
    f64s: Vec<f64>,
    out_f64: Vec<f64>,
}

impl RawBufs {
    fn new(size: usize, n: usize) -> Self {
        RawBufs {
            send: vec![1u8; size],
            recv: vec![0u8; size * n],
            f64s: (0..size / 8).map(|i| i as f64).collect(),
            out_f64: vec![0.0; size / 8],
        }
    }
}

/// One collective in raw MPI (rsmpi's thin wrappers over the C calls that
/// `bench/mpi_coll.c` makes).
fn raw_coll(w: &SimpleCommunicator, op: &str, size: usize, b: &mut RawBufs) {
    let n = w.size() as usize;
    let me = w.rank() as usize;
    match op {
        "barrier" => w.barrier(),
        "bcast" => w.process_at_rank(0).broadcast_into(&mut b.send[..]),
        "allgather" | "allgather_into" | "allgather_parts" => {
            w.all_gather_into(&b.send[..], &mut b.recv[..size * n])
        }
        "allreduce_into" => {
            w.all_reduce_into(&b.f64s[..], &mut b.out_f64[..], SystemOperation::sum())
        }
        "reduce_scatter" => w.reduce_scatter_block_into(
            &b.f64s[..],
            &mut b.out_f64[..size / 8 / n],
            SystemOperation::sum(),
        ),
        "alltoall_into" => w.all_to_all_into(&b.send[..], &mut b.recv[..size]),
        "alltoallv_into" => {
            use mpi::datatype::{Partition, PartitionMut};
            let counts = vec![(size / n) as i32; n];
            let displs: Vec<i32> = (0..n).map(|i| (i * (size / n)) as i32).collect();
            let sp = Partition::new(&b.send[..], &counts[..], &displs[..]);
            let mut rp = PartitionMut::new(&mut b.recv[..size], &counts[..], &displs[..]);
            w.all_to_all_varcount_into(&sp, &mut rp);
        }
        "sendrecv" => {
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            let _ = mpi::point_to_point::send_receive_into(
                &b.send[..],
                &w.process_at_rank(next as i32),
                &mut b.recv[..size],
                &w.process_at_rank(prev as i32),
            );
        }
        // (Names outside `COLLS` never get here: `Op::parse` refuses them.)
        _ => {}
    }
}

async fn one_iteration(
    comm: &Arc<dyn Communicator>,
    op: Op,
    tag: Tag,
    ack: Tag,
    msg: &Buffer,
) -> Result<(), BoxError> {
    match (op, comm.rank()) {
        (Op::Bw, 0) => {
            let sends: Vec<_> = (0..WINDOW)
                .map(|_| comm.send(1, tag, msg.clone()))
                .collect();
            for s in sends {
                s.await?;
            }
            comm.recv(1, ack).await?;
        }
        (Op::Bw, _) => {
            for _ in 0..WINDOW {
                comm.recv(0, tag).await?;
            }
            comm.send(0, ack, Buffer::from_vec(vec![0])).await?;
        }
        (Op::PingPong, 0) => {
            comm.send(1, tag, msg.clone()).await?;
            comm.recv(1, tag).await?;
        }
        (Op::PingPong, _) => {
            let m = comm.recv(0, tag).await?;
            comm.send(0, tag, m).await?;
        }
        (Op::Coll(c), _) => return Err(format!("{c} is not a point-to-point operation").into()),
    }
    Ok(())
}

/// The same iteration in raw MPI, as `bench/mpi_coll.c` does it: blocking
/// send and receive for ping-pong (rank 1 echoes what it received); for bw,
/// `WINDOW` nonblocking sends against `WINDOW` preposted receives into
/// distinct buffers.
fn raw_iteration(world: &SimpleCommunicator, op: Op, msg: &[u8], rbuf: &mut [u8]) {
    let n = msg.len();
    match (op, world.rank()) {
        (Op::Bw, 0) => {
            let peer = world.process_at_rank(1);
            mpi::request::scope(|scope| {
                let reqs: Vec<_> = (0..WINDOW)
                    .map(|_| peer.immediate_send_with_tag(scope, msg, RAW_TAG))
                    .collect();
                for r in reqs {
                    r.wait();
                }
            });
            let mut a = [0u8; 1];
            peer.receive_into_with_tag(&mut a[..], RAW_ACK);
        }
        (Op::Bw, _) => {
            let peer = world.process_at_rank(0);
            mpi::request::scope(|scope| {
                let reqs: Vec<_> = rbuf
                    .chunks_mut(n.max(1))
                    .take(WINDOW)
                    .map(|c| peer.immediate_receive_into_with_tag(scope, &mut c[..n], RAW_TAG))
                    .collect();
                for r in reqs {
                    r.wait();
                }
            });
            peer.send_with_tag(&[0u8][..], RAW_ACK);
        }
        (Op::PingPong, 0) => {
            let peer = world.process_at_rank(1);
            peer.send_with_tag(msg, RAW_TAG);
            peer.receive_into_with_tag(&mut rbuf[..n], RAW_TAG);
        }
        (Op::PingPong, _) => {
            let peer = world.process_at_rank(0);
            peer.receive_into_with_tag(&mut rbuf[..n], RAW_TAG);
            peer.send_with_tag(&rbuf[..n], RAW_TAG);
        }
        // (`rank` sends collectives to `rank_coll`.)
        (Op::Coll(_), _) => {}
    }
}

/// One rank of the benchmark (run under mpirun): per point, warm-up, then
/// `rounds` rounds of raw MPI and braid, alternating which goes first;
/// rank 0 prints each round's two times (us per message).
pub fn rank(args: MpiRankArgs) -> Result<(), BoxError> {
    let op = Op::parse(&args.op)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    if let Op::Coll(name) = op {
        return rt.block_on(rank_coll(args, name));
    }
    rt.block_on(async move {
        let mpi = Arc::new(MpiComm::init()?);
        let comm: Arc<dyn Communicator> = mpi.clone();
        if comm.nranks() != 2 {
            return Err::<(), BoxError>("the MPI benchmark needs exactly 2 ranks".into());
        }
        let no_raw = || -> BoxError {
            "this MPI gives less than MPI_THREAD_SERIALIZED: the raw side cannot run".into()
        };
        for (k, p) in args.points.iter().enumerate() {
            let (s, i) = p.split_once(':').ok_or("points are SIZE:ITERS")?;
            let (size, iters): (usize, usize) = (s.parse()?, i.parse()?);
            let tag = Tag::new(OpId(100 + k as u32), 0);
            let ack = Tag::new(OpId(100 + k as u32), 1);
            // Both sides send these same bytes. Two allocations made alike
            // still differ: on the 2-core VM, 64 MiB shared-memory streams
            // from one ran 10-15% slower than from the other, in raw MPI
            // and braid alike (page walks and the copy itself; likely how
            // the host backs each range), which read as braid's gap.
            let msg = Buffer::from_vec(vec![1u8; size]);
            let slots = match op {
                Op::Bw => WINDOW,
                Op::PingPong | Op::Coll(_) => 1,
            };
            let mut rbuf = vec![0u8; size.max(1) * slots];
            let raw = |n: usize, rbuf: &mut Vec<u8>| -> Result<f64, BoxError> {
                mpi.with_world(|w| {
                    // Both ranks hold their engines before any raw message
                    // moves: a peer still finishing braid's round would
                    // otherwise run a pass, whose any-source probe takes
                    // the raw message.
                    w.barrier();
                    let t = Instant::now();
                    for _ in 0..n {
                        raw_iteration(w, op, msg.as_slice(), rbuf);
                    }
                    t.elapsed().as_secs_f64()
                })
                .ok_or_else(no_raw)
            };
            // 5 warm-up iterations each (connections, buffers).
            raw(5, &mut rbuf)?;
            for _ in 0..5 {
                one_iteration(&comm, op, tag, ack, &msg).await?;
            }
            for round in 0..args.rounds {
                let braid_first = round % 2 == 1;
                let mut raw_s = 0.0;
                if !braid_first {
                    raw_s = raw(iters, &mut rbuf)?;
                }
                let t = Instant::now();
                for _ in 0..iters {
                    one_iteration(&comm, op, tag, ack, &msg).await?;
                }
                let braid_s = t.elapsed().as_secs_f64();
                if braid_first {
                    raw_s = raw(iters, &mut rbuf)?;
                }
                if comm.rank() == 0 {
                    let us = |s: f64| s * 1e6 / iters as f64 / op.per_iteration();
                    outln!(
                        "ROUND bytes={size} raw_us={:.3} braid_us={:.3}",
                        us(raw_s),
                        us(braid_s)
                    );
                }
            }
        }
        comm.shutdown().await?;
        Ok(())
    })
}

/// One rank of the collective benchmark: per point, warm-up, then `rounds`
/// rounds of the raw MPI collective and braid's, alternating which goes
/// first; each round's time is the slowest rank's (as `bench/mpi_coll.c`
/// reduces with `MPI_MAX`), printed by rank 0 in us per operation.
async fn rank_coll(args: MpiRankArgs, op: &'static str) -> Result<(), BoxError> {
    let mpi = Arc::new(MpiComm::init()?);
    let comm: Arc<dyn Communicator> = mpi.clone();
    let n = comm.nranks() as usize;
    let ctx: Context = context_for(comm.clone(), MemoryLimits::UNLIMITED);
    let no_raw = || -> BoxError {
        "this MPI gives less than MPI_THREAD_SERIALIZED: the raw side cannot run".into()
    };
    for p in &args.points {
        let (s, i) = p.split_once(':').ok_or("points are SIZE:ITERS")?;
        let (size, iters): (usize, usize) = (s.parse()?, i.parse()?);
        let mut input = Input::new(op, size, comm.rank());
        let mut bufs = RawBufs::new(size, n);
        // Both ranks hold their engines (a barrier first) while raw MPI
        // runs: no braid pass, whose any-source probe would take a raw
        // message, runs meanwhile. The raw side's messages are all
        // received inside the round.
        let mut raw = |k: usize| -> Result<f64, BoxError> {
            mpi.with_world(|w| {
                w.barrier();
                let t = Instant::now();
                for _ in 0..k {
                    raw_coll(w, op, size, &mut bufs);
                }
                t.elapsed().as_secs_f64()
            })
            .ok_or_else(no_raw)
        };
        raw(5)?;
        for _ in 0..5 {
            run_op(&ctx, op, size, &mut input).await?;
        }
        for round in 0..args.rounds {
            let braid_first = round % 2 == 1;
            let mut raw_s = 0.0;
            if !braid_first {
                raw_s = raw(iters)?;
            }
            braid_coll::barrier(&ctx).await?;
            let t = Instant::now();
            for _ in 0..iters {
                run_op(&ctx, op, size, &mut input).await?;
            }
            let braid_s = t.elapsed().as_secs_f64();
            if braid_first {
                raw_s = raw(iters)?;
            }
            // The slowest rank's times.
            let mut worst = [0.0f64; 2];
            mpi.with_world(|w| {
                w.all_reduce_into(
                    &[raw_s, braid_s][..],
                    &mut worst[..],
                    SystemOperation::max(),
                )
            })
            .ok_or_else(no_raw)?;
            if comm.rank() == 0 {
                let us = |s: f64| s * 1e6 / iters as f64;
                outln!(
                    "ROUND bytes={size} raw_us={:.3} braid_us={:.3}",
                    us(worst[0]),
                    us(worst[1])
                );
            }
        }
        check_op(&ctx, op, size, &mut input).await?;
    }
    if std::env::var_os("BRAID_BENCH_STATS").is_some() {
        braid_examples::errln!("{}", comm.statistics());
    }
    drop(ctx);
    comm.shutdown().await?;
    Ok(())
}

/// The rounds of one launch: (bytes, raw us, braid us) per line.
fn rounds(out: &std::process::Output) -> Result<Vec<(usize, f64, f64)>, BoxError> {
    if !out.status.success() {
        return Err(format!(
            "braid over mpirun failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |l: &str, k: &str| -> Option<String> {
        l.split_whitespace()
            .find_map(|w| w.strip_prefix(k).map(str::to_string))
    };
    Ok(text
        .lines()
        .filter(|l| l.starts_with("ROUND"))
        .filter_map(|l| {
            Some((
                field(l, "bytes=")?.parse().ok()?,
                field(l, "raw_us=")?.parse().ok()?,
                field(l, "braid_us=")?.parse().ok()?,
            ))
        })
        .collect())
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
    if let Some((var, _)) = braid_core::world::mpi_launch_size() {
        return Err(format!(
            "`braid-bench mpi` starts mpirun itself (this process was started by an MPI launcher: {var} is set); run it directly"
        )
        .into());
    }
    let ops = args
        .ops
        .iter()
        .map(|o| Op::parse(o))
        .collect::<Result<Vec<_>, _>>()?;
    let mpi = if args.reps > 0 {
        Some(super::coll::mpi_binary(&args.mpi)?)
    } else {
        None
    };
    let me = std::env::current_exe()?;
    outln!("# braid-bench mpi: braid's mpi backend vs raw MPI");
    outln!();
    outln!(
        "bw: rank 0 sends {WINDOW} messages back to back, rank 1 receives them and acknowledges"
    );
    outln!("(as osu_bw); pingpong: one message there and back; both on 2 ranks, us per message.");
    outln!("Collectives: braid's call against MPI's own on every rank, us per operation (the");
    outln!("slowest rank's time).");
    outln!(
        "In one mpirun, each rank alternates {} rounds of raw MPI calls and of braid (which goes",
        args.rounds
    );
    outln!("first alternates too). braid and MPI: medians over the rounds; x: the median of the");
    outln!("rounds' MPI time / braid time (= braid bandwidth / MPI bandwidth), then its range.");
    outln!(
        "mpi_coll: the separate C program's best of {} runs, for reference.",
        args.reps
    );
    for (name, btl) in [
        ("shared memory (self,vader)", "self,vader"),
        ("tcp (tcp,self)", "tcp,self"),
    ] {
        for &op in &ops {
            let rank_counts = match op {
                Op::Coll(_) => args.ranks.clone(),
                Op::Bw | Op::PingPong => vec![2],
            };
            for n in rank_counts {
                let nr = n as usize;
                let mut sizes: Vec<usize> = match op {
                    Op::Coll("barrier") => vec![0],
                    Op::Coll(c) => args.sizes.iter().map(|s| used_bytes(c, *s, nr)).collect(),
                    Op::Bw | Op::PingPong => args.sizes.clone(),
                };
                // Each size once: the rounds are matched to points by size.
                sizes.sort_unstable();
                sizes.dedup();
                let points: Vec<(usize, usize)> = sizes
                    .iter()
                    .map(|s| (*s, iters_for(op, *s, nr, args.bytes_per_point)))
                    .collect();
                let list = super::coll::points_arg(&points);
                let mpirun = || super::coll::mpirun(n, btl);
                let bo = mpirun()
                    .arg(&me)
                    .args(["mpi-rank", "--op", &args_name(op), "--points", &list])
                    .args(["--rounds", &args.rounds.to_string()])
                    .output()?;
                let all = rounds(&bo)?;
                let mut separate = vec![f64::INFINITY; points.len()];
                if let Some(mpi) = &mpi {
                    for _ in 0..args.reps {
                        let mo = mpirun().arg(mpi).args([op.c_name(), &list]).output()?;
                        for (x, y) in
                            separate
                                .iter_mut()
                                .zip(results(&mo, "mpi_coll", points.len())?)
                        {
                            *x = x.min(y);
                        }
                    }
                }
                outln!();
                outln!("## {}, {n} ranks, {name}", args_name(op));
                outln!();
                if matches!(op, Op::Coll(c) if super::coll::fresh_result(c)) {
                    outln!("{}", super::coll::FRESH_NOTE);
                    outln!();
                }
                outln!(
                    "| size | braid us | MPI us | braid GB/s | MPI GB/s | x | x range | mpi_coll us |"
                );
                outln!("|---:|---:|---:|---:|---:|---:|---|---:|");
                for (k, (size, _)) in points.iter().enumerate() {
                    let mine: Vec<_> = all.iter().filter(|r| r.0 == *size).collect();
                    if mine.len() != args.rounds as usize {
                        return Err(format!(
                            "{} rounds of {} for {size} bytes:\n{}",
                            mine.len(),
                            args.rounds,
                            String::from_utf8_lossy(&bo.stdout)
                        )
                        .into());
                    }
                    let raw: Vec<f64> = mine.iter().map(|r| r.1).collect();
                    let braid: Vec<f64> = mine.iter().map(|r| r.2).collect();
                    let x: Vec<f64> = mine.iter().map(|r| r.1 / r.2).collect();
                    let (lo, hi) = x
                        .iter()
                        .fold((f64::INFINITY, 0.0f64), |(a, b), v| (a.min(*v), b.max(*v)));
                    let (b, r, xm) = (median(braid), median(raw), median(x));
                    let gbs = |us: f64| *size as f64 / us / 1e3;
                    // `--reps 0`: the C program did not run.
                    let sep = if separate[k].is_finite() {
                        format!("{:.2}", separate[k])
                    } else {
                        "-".to_string()
                    };
                    outln!(
                        "| {} | {b:.2} | {r:.2} | {:.2} | {:.2} | {xm:.2} | {lo:.2}-{hi:.2} | {sep} |",
                        size_name(*size),
                        gbs(b),
                        gbs(r),
                    );
                }
            }
        }
    }
    Ok(())
}

/// The operation's name on the command line.
fn args_name(op: Op) -> String {
    match op {
        Op::Bw => "bw".into(),
        Op::PingPong => "pingpong".into(),
        Op::Coll(c) => c.into(),
    }
}
