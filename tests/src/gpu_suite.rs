//! The device collective suite one rank runs (feature `cuda`). Inputs are
//! regenerated from the seed for every rank, outputs are poisoned before
//! each call, and every result is checked element by element against a
//! CPU reference computed here.

use std::sync::Arc;
use std::time::Duration;

use braid_coll::device::{
    self as dev, DeviceAllToAllv, DeviceComm, DeviceHaloExchange, DeviceShuffle,
};
use braid_coll::{DType, Element, PartitionOwner, ReduceKind};
use braid_core::cuda::ipc::IpcSendRecv;
use braid_core::cuda::{DeviceBuffer, Gpu, NcclMode, Transport};
use braid_core::{Context, Rank};

use crate::coll_suite::{TestValue, input};
use crate::{SplitMix, check_payload, payload, seed_of};

type R<T> = Result<T, String>;

const POISON: u8 = 0xA5;

fn ensure(cond: bool, msg: impl FnOnce() -> String) -> R<()> {
    if cond { Ok(()) } else { Err(msg()) }
}

fn e<E: std::fmt::Display>(x: E) -> String {
    x.to_string()
}

/// The rank counts a GPU test runs here: all of [`crate::RANK_COUNTS`]
/// on any host with a GPU (ranks beyond the GPU count share GPUs, and their
/// communicators then move device data through host memory), none without
/// one (the test says it skipped, naming `what`). Turns on poisoned
/// allocations, so that unwritten outputs show.
pub fn rank_counts(what: &str) -> Vec<u32> {
    braid_core::cuda::poison_new_allocations(true);
    if Gpu::count() == 0 {
        // Straight to stderr: the harness does not capture this, so the
        // skip shows in a normal `cargo test` run.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "{what} skipped: no CUDA device on this host"
        );
        return Vec::new();
    }
    crate::RANK_COUNTS.to_vec()
}

fn poisoned(gpu: &Arc<Gpu>, len: usize) -> R<DeviceBuffer> {
    let mut b = DeviceBuffer::alloc(gpu, len).map_err(e)?;
    b.fill(POISON).map_err(e)?;
    Ok(b)
}

/// Whether `got` is `want`: bit for bit when `exact` (and for integers),
/// otherwise within 1e-5 relative (1e-5 absolute below 1) plus `slack[i]`.
fn close<T: TestValue>(got: &[T], want: &[T], exact: bool, slack: &[f64]) -> bool {
    if got.len() != want.len() {
        return false;
    }
    if exact || T::DTYPE == DType::I32 || T::DTYPE == DType::I64 {
        return bytemuck::cast_slice::<T, u8>(got) == bytemuck::cast_slice::<T, u8>(want);
    }
    got.iter().zip(want).enumerate().all(|(i, (g, w))| {
        let (g, w) = (g.to_f64(), w.to_f64());
        (g - w).abs() <= 1e-5 * w.abs().max(1.0) + slack.get(i).copied().unwrap_or(0.0)
    })
}

/// How far a floating-point sum over ranks of `parts` may move with the
/// order of its additions (NCCL's ring adds in another order than the
/// reference, which adds in rank order): each of the n - 1 additions
/// rounds by at most one unit in the last place of a partial sum, and a
/// partial sum is at most the sum of the magnitudes. Without it, values
/// of 1000 that cancel to under 1 failed a 1e-5 absolute bound in f32 on
/// 3 GPUs. Zero for other operations (their rounding is relative).
fn sum_slack<T: TestValue>(kind: ReduceKind, parts: &[Vec<T>]) -> Vec<f64> {
    let len = parts.first().map_or(0, Vec::len);
    if kind != ReduceKind::Sum {
        return vec![0.0; len];
    }
    let eps = match T::DTYPE {
        DType::F32 => f32::EPSILON as f64,
        _ => f64::EPSILON,
    };
    (0..len)
        .map(|i| {
            let mag: f64 = parts.iter().map(|p| p[i].to_f64().abs()).sum();
            parts.len() as f64 * eps * mag
        })
        .collect()
}

/// The reduction of `parts` (one input per rank) in rank order, and its
/// per-element [`sum_slack`].
fn reference<T: TestValue>(kind: ReduceKind, parts: &[Vec<T>]) -> (Vec<T>, Vec<f64>) {
    let mut want = parts.first().cloned().unwrap_or_default();
    for p in parts.iter().skip(1) {
        braid_kernels::reduce::reduce_into(&mut want, p, kind);
    }
    (want, sum_slack(kind, parts))
}

/// f64 view of a test value (for tolerances).
trait ToF64 {
    fn to_f64(&self) -> f64;
}
impl<T: bytemuck::Pod + Element> ToF64 for T {
    fn to_f64(&self) -> f64 {
        match T::DTYPE {
            DType::I32 => *bytemuck::cast_ref::<T, i32>(self) as f64,
            DType::I64 => *bytemuck::cast_ref::<T, i64>(self) as f64,
            DType::F32 => *bytemuck::cast_ref::<T, f32>(self) as f64,
            DType::F64 => *bytemuck::cast_ref::<T, f64>(self),
            DType::Bytes => 0.0,
        }
    }
}

async fn check_reduce<T: TestValue>(dc: &DeviceComm, seed: u64, t: u64, len: usize) -> R<u64> {
    let (me, n) = (dc.rank(), dc.nranks());
    let gpu = dc.gpu().clone();
    let sz = std::mem::size_of::<T>();
    let mut checks = 0;
    for kind in [
        ReduceKind::Sum,
        ReduceKind::Prod,
        ReduceKind::Min,
        ReduceKind::Max,
    ] {
        let t = t * 8 + kind as u64;
        let parts: Vec<Vec<T>> = (0..n).map(|q| input::<T>(seed, t, q, len)).collect();
        let (want, slack) = reference(kind, &parts);
        // Two ranks: one addition per element, order-free, so exact.
        let exact = n <= 2;
        let src = DeviceBuffer::from_slice(&gpu, &parts[me as usize]).map_err(e)?;
        let out = dev::allreduce(dc, &src, poisoned(&gpu, len * sz)?, T::DTYPE, kind)
            .await
            .map_err(e)?;
        let got: Vec<T> = out.to_vec().map_err(e)?;
        ensure(close(&got, &want, exact, &slack), || {
            format!(
                "rank {me}: device allreduce {kind:?} of {len} {} differs",
                T::DTYPE
            )
        })?;
        // Same bits on every rank.
        let all = poisoned(&gpu, len * sz * n as usize)?;
        let all: Vec<u8> = dev::allgather(dc, &out, all)
            .await
            .map_err(e)?
            .to_host()
            .map_err(e)?;
        let mine = out.to_host().map_err(e)?;
        for q in 0..n as usize {
            ensure(
                all[q * mine.len()..(q + 1) * mine.len()] == mine[..],
                || format!("rank {me}: allreduce result of rank {q} differs from this rank's"),
            )?;
        }
        // ReduceScatter: block `me` of the reduction of N blocks each.
        let blk = len;
        let rs_parts: Vec<Vec<T>> = (0..n)
            .map(|q| input::<T>(seed, t + 1000, q, blk * n as usize))
            .collect();
        let (rs_want, rs_slack) = reference(kind, &rs_parts);
        let src = DeviceBuffer::from_slice(&gpu, &rs_parts[me as usize]).map_err(e)?;
        let out = dev::reduce_scatter(dc, &src, poisoned(&gpu, blk * sz)?, T::DTYPE, kind)
            .await
            .map_err(e)?;
        let got: Vec<T> = out.to_vec().map_err(e)?;
        let mine = me as usize * blk..(me as usize + 1) * blk;
        let w = &rs_want[mine.clone()];
        ensure(close(&got, w, exact, &rs_slack[mine]), || {
            format!(
                "rank {me}: device reduce_scatter {kind:?} of {blk} {} differs",
                T::DTYPE
            )
        })?;
        checks += 2;
    }
    Ok(checks)
}

/// Rank `r`'s byte input for test `t`.
fn bytes_of(seed: u64, t: u64, r: Rank, len: usize) -> Vec<u8> {
    payload(seed_of(&[seed, t, r as u64]), len)
}

async fn check_moves(dc: &DeviceComm, seed: u64, t: u64, len: usize) -> R<u64> {
    let (me, n) = (dc.rank(), dc.nranks());
    let nn = n as usize;
    let gpu = dc.gpu().clone();
    // Broadcast from every root.
    for root in 0..n {
        let mut b = poisoned(&gpu, len)?;
        if me == root {
            b = DeviceBuffer::from_host(&gpu, &bytes_of(seed, t, root, len)).map_err(e)?;
        }
        let got = dev::broadcast(dc, b, root)
            .await
            .map_err(e)?
            .to_host()
            .map_err(e)?;
        ensure(got == bytes_of(seed, t, root, len), || {
            format!("rank {me}: broadcast of {len} bytes from root {root} differs")
        })?;
    }
    // AllGather.
    let src = DeviceBuffer::from_host(&gpu, &bytes_of(seed, t + 1, me, len)).map_err(e)?;
    let got = dev::allgather(dc, &src, poisoned(&gpu, len * nn)?)
        .await
        .map_err(e)?
        .to_host()
        .map_err(e)?;
    for q in 0..n {
        ensure(
            got[q as usize * len..(q as usize + 1) * len] == bytes_of(seed, t + 1, q, len)[..],
            || format!("rank {me}: allgather block {q} of {len} bytes differs"),
        )?;
    }
    // AllToAll: block p of rank q's input lands in block q on rank p.
    let blk = len;
    let src = DeviceBuffer::from_host(&gpu, &bytes_of(seed, t + 2, me, blk * nn)).map_err(e)?;
    let got = dev::alltoall(dc, &src, poisoned(&gpu, blk * nn)?)
        .await
        .map_err(e)?
        .to_host()
        .map_err(e)?;
    for q in 0..nn {
        let theirs = bytes_of(seed, t + 2, q as Rank, blk * nn);
        ensure(
            got[q * blk..(q + 1) * blk] == theirs[me as usize * blk..(me as usize + 1) * blk],
            || format!("rank {me}: alltoall block from {q} differs"),
        )?;
    }
    // AllToAllv with random counts (some zero) and gaps between ranges.
    let count = |s: Rank, d: Rank| -> usize {
        let x = SplitMix(seed_of(&[seed, t + 3, s as u64, d as u64])).next_u64();
        if x % 5 == 0 {
            0
        } else {
            (x % (2 * len as u64 + 3)) as usize
        }
    };
    let send_counts: Vec<usize> = (0..n).map(|d| count(me, d)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|s| count(s, me)).collect();
    let gap = 17;
    let offs = |c: &[usize]| {
        let mut o = Vec::new();
        let mut acc = gap;
        for &x in c {
            o.push(acc);
            acc += x + gap;
        }
        (o, acc)
    };
    let (send_offsets, send_len) = offs(&send_counts);
    let (recv_offsets, recv_len) = offs(&recv_counts);
    let mut host_in = vec![0u8; send_len];
    for d in 0..nn {
        let p = payload(seed_of(&[seed, t + 4, me as u64, d as u64]), send_counts[d]);
        host_in[send_offsets[d]..send_offsets[d] + send_counts[d]].copy_from_slice(&p);
    }
    let src = DeviceBuffer::from_host(&gpu, &host_in).map_err(e)?;
    let spec = DeviceAllToAllv {
        send_counts,
        send_offsets,
        recv_counts: recv_counts.clone(),
        recv_offsets: recv_offsets.clone(),
    };
    let got = dev::alltoallv(dc, &src, poisoned(&gpu, recv_len)?, spec)
        .await
        .map_err(e)?
        .to_host()
        .map_err(e)?;
    for s in 0..nn {
        let want = payload(seed_of(&[seed, t + 4, s as u64, me as u64]), recv_counts[s]);
        ensure(
            got[recv_offsets[s]..recv_offsets[s] + recv_counts[s]] == want[..],
            || format!("rank {me}: alltoallv bytes from {s} differ"),
        )?;
        ensure(
            got[recv_offsets[s] - gap..recv_offsets[s]]
                .iter()
                .all(|&b| b == POISON),
            || format!("rank {me}: alltoallv wrote outside the range of rank {s}"),
        )?;
    }
    // SendRecv ring step: to the right, from the left.
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let src =
        DeviceBuffer::from_host(&gpu, &bytes_of(seed, t + 5, me, len + me as usize)).map_err(e)?;
    let got = dev::sendrecv(
        dc,
        Some((&src, right)),
        Some((poisoned(&gpu, len + left as usize)?, left)),
    )
    .await
    .map_err(e)?
    .ok_or("sendrecv returned no buffer")?
    .to_host()
    .map_err(e)?;
    ensure(
        got == bytes_of(seed, t + 5, left, len + left as usize),
        || format!("rank {me}: sendrecv from {left} differs"),
    )?;
    Ok(n as u64 + 4)
}

async fn check_halo(dc: &DeviceComm, seed: u64, t: u64) -> R<u64> {
    let (me, n) = (dc.rank(), dc.nranks());
    let gpu = dc.gpu().clone();
    // Sizes: some sides empty, some absent.
    let size = |r: Rank, side: u64| {
        let s = seed_of(&[seed, t, r as u64, side]);
        (s % 5000) as usize * usize::from(s % 4 != 0)
    };
    let mk = |side: u64| -> R<Option<DeviceBuffer>> {
        let sz = size(me, side);
        if sz == 0 && side == 1 {
            return Ok(None);
        }
        DeviceBuffer::from_host(&gpu, &payload(seed_of(&[seed, t, me as u64, side, 9]), sz))
            .map(Some)
            .map_err(e)
    };
    let (l, r) = (mk(0)?, mk(1)?);
    let h = DeviceHaloExchange::new(dc)
        .exchange(l.as_ref(), r.as_ref())
        .await
        .map_err(e)?;
    let expect = |from: Rank, side: u64| {
        payload(seed_of(&[seed, t, from as u64, side, 9]), size(from, side))
    };
    match (me, h.from_left) {
        (0, None) => {}
        (0, Some(_)) => return Err("rank 0 got data from the left".into()),
        (_, None) => return Err(format!("rank {me}: nothing from the left")),
        (_, Some(b)) => {
            ensure(b.to_host().map_err(e)? == expect(me - 1, 1), || {
                format!("rank {me}: halo from the left differs")
            })?;
        }
    }
    match (me + 1 == n, h.from_right) {
        (true, None) => {}
        (true, Some(_)) => return Err("last rank got data from the right".into()),
        (false, None) => return Err(format!("rank {me}: nothing from the right")),
        (false, Some(b)) => {
            ensure(b.to_host().map_err(e)? == expect(me + 1, 0), || {
                format!("rank {me}: halo from the right differs")
            })?;
        }
    }
    // The sized round: receive buffers of the known lengths, poisoned.
    let fl = if me > 0 {
        Some(poisoned(&gpu, size(me - 1, 1))?)
    } else {
        None
    };
    let fr = if me + 1 < n {
        Some(poisoned(&gpu, size(me + 1, 0))?)
    } else {
        None
    };
    let h = DeviceHaloExchange::new(dc)
        .exchange_sized(l.as_ref(), r.as_ref(), fl, fr)
        .await
        .map_err(e)?;
    if let Some(b) = h.from_left {
        ensure(b.to_host().map_err(e)? == expect(me - 1, 1), || {
            format!("rank {me}: sized halo from the left differs")
        })?;
    }
    if let Some(b) = h.from_right {
        ensure(b.to_host().map_err(e)? == expect(me + 1, 0), || {
            format!("rank {me}: sized halo from the right differs")
        })?;
    }
    Ok(2)
}

async fn check_shuffle(dc: &DeviceComm, seed: u64, t: u64) -> R<u64> {
    let (me, n) = (dc.rank(), dc.nranks());
    let gpu = dc.gpu().clone();
    let nparts = 11u32;
    let chunks = |r: Rank| -> Vec<(u32, u64, usize)> {
        let mut g = SplitMix(seed_of(&[seed, t, r as u64]));
        (0..20)
            .map(|_| {
                let pid = g.below(nparts as u64) as u32;
                let s = g.next_u64();
                (pid, s, g.below(70_000) as usize)
            })
            .collect()
    };
    for owner in [PartitionOwner::RoundRobin, PartitionOwner::Contiguous] {
        let mut sh = DeviceShuffle::new(dc, nparts, owner);
        for (pid, s, size) in chunks(me) {
            sh.insert(
                pid,
                DeviceBuffer::from_host(&gpu, &payload(s, size)).map_err(e)?,
            )
            .map_err(e)?;
        }
        let mut got = sh.finish().await.map_err(e)?;
        for pid in 0..nparts {
            if owner.owner(pid, nparts, n) != me {
                continue;
            }
            let parts = got.extract(pid, dc).map_err(e)?;
            // Own chunks first, then by source rank, insertion order kept.
            let order = std::iter::once(me).chain((0..n).filter(|&q| q != me));
            let want: Vec<(u64, usize)> = order
                .flat_map(|q| {
                    chunks(q)
                        .into_iter()
                        .filter(|c| c.0 == pid)
                        .map(|c| (c.1, c.2))
                })
                .collect();
            ensure(parts.len() == want.len(), || {
                format!(
                    "rank {me}: partition {pid} has {} chunks, want {}",
                    parts.len(),
                    want.len()
                )
            })?;
            for (b, (s, size)) in parts.iter().zip(&want) {
                let h = b.to_host().map_err(e)?;
                ensure(h.len() == *size && check_payload(*s, &h).is_ok(), || {
                    format!("rank {me}: partition {pid}: chunk differs")
                })?;
            }
        }
    }
    Ok(2)
}

/// Copy-engine SendRecv over CUDA IPC: a ring step, then both directions
/// with a neighbour.
pub async fn check_ipc(ctx: &Context, gpu: Arc<Gpu>, seed: u64) -> R<u64> {
    let (me, n) = (ctx.rank(), ctx.nranks());
    let mut ipc = IpcSendRecv::new(ctx, gpu.clone()).await.map_err(e)?;
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let mut checks = 0;
    for (step, len) in [(0u64, 1usize), (1, 4096 + 7), (2, 3 << 20), (3, 0)] {
        let size = |r: Rank| len + r as usize;
        let src =
            DeviceBuffer::from_host(&gpu, &payload(seed_of(&[seed, step, me as u64]), size(me)))
                .map_err(e)?;
        let got = ipc
            .sendrecv(
                Some((&src, right)),
                Some((poisoned(&gpu, size(left))?, left)),
            )
            .await
            .map_err(e)?
            .ok_or("no buffer")?
            .to_host()
            .map_err(e)?;
        ensure(
            got == payload(seed_of(&[seed, step, left as u64]), size(left)),
            || format!("rank {me}: IPC sendrecv step {step} from {left} differs"),
        )?;
        checks += 1;
    }
    // The same receive buffer reused (cached handle) several times.
    let mut out = Some(poisoned(&gpu, 1 << 20)?);
    for step in 10..13u64 {
        let src =
            DeviceBuffer::from_host(&gpu, &payload(seed_of(&[seed, step, me as u64]), 1 << 20))
                .map_err(e)?;
        let mut b = out.take().ok_or("lost buffer")?;
        b.fill(POISON).map_err(e)?;
        let got = ipc
            .sendrecv(Some((&src, right)), Some((b, left)))
            .await
            .map_err(e)?
            .ok_or("no buffer")?;
        ensure(
            got.to_host().map_err(e)? == payload(seed_of(&[seed, step, left as u64]), 1 << 20),
            || format!("rank {me}: IPC sendrecv into a reused buffer, step {step}, differs"),
        )?;
        out = Some(got);
        checks += 1;
    }
    Ok(checks)
}

/// Runs every device check on this rank; returns `gpu ok CHECKS`.
pub async fn run(ctx: Context, seed: u64) -> R<String> {
    let gpu = Gpu::for_rank(ctx.rank()).map_err(e)?;
    let dc = DeviceComm::new(&ctx, gpu.clone()).await.map_err(e)?;
    // One rank needs no NCCL: its calls are copies on the stream.
    if ctx.nranks() == 1 && std::env::var_os(braid_core::cuda::TRANSPORT_VAR).is_none() {
        let t = dc.nccl().transport();
        ensure(t == Transport::Solo, || {
            format!("one rank: transport {t:?}, expected Solo")
        })?;
    }
    let mut checks = 0u64;
    let mut t = 0u64;
    for len in [0usize, 1, 7, 1000, 65_537, 1 << 20] {
        t += 1;
        checks += check_reduce::<i32>(&dc, seed, t * 10, len).await?;
        checks += check_reduce::<i64>(&dc, seed, t * 10 + 1, len).await?;
        checks += check_reduce::<f32>(&dc, seed, t * 10 + 2, len).await?;
        checks += check_reduce::<f64>(&dc, seed, t * 10 + 3, len).await?;
        checks += check_moves(&dc, seed, t * 10 + 4, len).await?;
    }
    for round in 0..3 {
        checks += check_halo(&dc, seed, 500 + round).await?;
    }
    checks += check_shuffle(&dc, seed, 600).await?;
    // Four collectives in flight at once, completed in any order.
    let srcs: Vec<DeviceBuffer> = (0..4)
        .map(|i| DeviceBuffer::from_slice(&gpu, &input::<i64>(seed, 700 + i, ctx.rank(), 10_000)))
        .collect::<Result<_, _>>()
        .map_err(e)?;
    let mut handles = Vec::new();
    for s in &srcs {
        let out = poisoned(&gpu, 80_000)?;
        handles.push(dev::start_allreduce(
            &dc,
            s,
            out,
            DType::I64,
            ReduceKind::Sum,
            None,
        ));
    }
    for (i, h) in handles.into_iter().enumerate().rev() {
        let out: Vec<i64> = tokio::task::spawn_blocking(move || h.wait())
            .await
            .map_err(e)?
            .map_err(e)?
            .to_vec()
            .map_err(e)?;
        let mut want = input::<i64>(seed, 700 + i as u64, 0, 10_000);
        for q in 1..ctx.nranks() {
            braid_kernels::reduce::reduce_into(
                &mut want,
                &input::<i64>(seed, 700 + i as u64, q, 10_000),
                ReduceKind::Sum,
            );
        }
        ensure(out == want, || format!("in-flight allreduce {i} differs"))?;
        checks += 1;
    }
    // The copy-engine SendRecv needs a GPU per rank.
    if dc.nccl().transport() != Transport::HostStaged {
        checks += check_ipc(&ctx, gpu.clone(), seed).await?;
    }
    Ok(format!("gpu ok {checks}"))
}

/// The device shuffle under a device memory limit far below what it holds:
/// chunks spill to host and come back intact. Returns the bytes spilled.
pub async fn shuffle_spill(ctx: Context, seed: u64) -> R<u64> {
    let gpu = Gpu::for_rank(ctx.rank()).map_err(e)?;
    let dc = DeviceComm::new(&ctx, gpu).await.map_err(e)?;
    let before = ctx.statistics().spilled_bytes();
    check_shuffle(&dc, seed, 900).await?;
    let spilled = ctx.statistics().spilled_bytes() - before;
    ensure(spilled > 0, || {
        format!(
            "rank {}: nothing spilled under the device limit",
            ctx.rank()
        )
    })?;
    Ok(spilled)
}

/// Mismatched calls: every rank must fail (no data), in bounded time.
pub async fn mismatch(ctx: Context, case: u32, mode: NcclMode) -> R<()> {
    let gpu = Gpu::for_rank(ctx.rank()).map_err(e)?;
    let dc = tokio::time::timeout(
        Duration::from_secs(60),
        DeviceComm::new_with(&ctx, gpu.clone(), mode),
    )
    .await
    .map_err(|_| "timed out creating the NCCL communicator")?
    .map_err(e)?;
    let me = ctx.rank();
    let fut = async {
        match case {
            // Counts differ.
            0 => {
                let len = 1000 + 8 * me as usize;
                let src = DeviceBuffer::from_slice(&gpu, &vec![1i64; len]).map_err(e)?;
                dev::allreduce(
                    &dc,
                    &src,
                    poisoned(&gpu, len * 8)?,
                    DType::I64,
                    ReduceKind::Sum,
                )
                .await
                .map(|_| ())
                .map_err(e)
            }
            // Roots differ.
            1 => dev::broadcast(&dc, poisoned(&gpu, 4096)?, me % 2)
                .await
                .map(|_| ())
                .map_err(e),
            // Different kinds at one call: AllReduce on even ranks,
            // AllToAllv on odd ones (their checks used to go under stages
            // of their own and wait for ever).
            3 => {
                let n = ctx.nranks() as usize;
                if me % 2 == 0 {
                    let src = DeviceBuffer::from_slice(&gpu, &vec![1i64; 1000]).map_err(e)?;
                    dev::allreduce(
                        &dc,
                        &src,
                        poisoned(&gpu, 8000)?,
                        DType::I64,
                        ReduceKind::Sum,
                    )
                    .await
                    .map(|_| ())
                    .map_err(e)
                } else {
                    let spec = DeviceAllToAllv::packed(vec![100; n], vec![100; n]);
                    let src = poisoned(&gpu, 100 * n)?;
                    dev::alltoallv(&dc, &src, poisoned(&gpu, 100 * n)?, spec)
                        .await
                        .map(|_| ())
                        .map_err(e)
                }
            }
            // A shuffle on the last rank, a halo exchange on the others.
            4 => {
                if me + 1 == ctx.nranks() {
                    let mut sh = DeviceShuffle::new(&dc, 4, PartitionOwner::RoundRobin);
                    sh.insert(0, poisoned(&gpu, 64)?).map_err(e)?;
                    sh.finish().await.map(|_| ()).map_err(e)
                } else {
                    let b = poisoned(&gpu, 64)?;
                    DeviceHaloExchange::new(&dc)
                        .exchange(Some(&b), Some(&b))
                        .await
                        .map(|_| ())
                        .map_err(e)
                }
            }
            // Shuffles whose owner policies differ, each rank inserting
            // only into partitions it owns by its own policy (nothing is
            // routed wrongly: partitions would be split unnoticed).
            5 | 6 => {
                let owner = if me == 0 {
                    PartitionOwner::RoundRobin
                } else {
                    PartitionOwner::Contiguous
                };
                // Case 6: the partition counts differ instead.
                let (owner, nparts) = match case {
                    5 => (owner, 4 * ctx.nranks()),
                    _ => (PartitionOwner::Contiguous, 4 * ctx.nranks() + me % 2),
                };
                let mut sh = DeviceShuffle::new(&dc, nparts, owner);
                for pid in owner.owned(me, nparts, ctx.nranks()) {
                    sh.insert(pid, poisoned(&gpu, 64)?).map_err(e)?;
                }
                sh.finish().await.map(|_| ()).map_err(e)
            }
            // AllToAllv counts disagree with the peer's.
            _ => {
                let n = ctx.nranks() as usize;
                let send = vec![100usize; n];
                let recv = vec![100 + me as usize; n];
                let spec = DeviceAllToAllv::packed(send, recv.clone());
                let src = poisoned(&gpu, 100 * n)?;
                dev::alltoallv(&dc, &src, poisoned(&gpu, recv.iter().sum())?, spec)
                    .await
                    .map(|_| ())
                    .map_err(e)
            }
        }
    };
    match tokio::time::timeout(Duration::from_secs(60), fut).await {
        Err(_) => Err("timed out: the mismatch hung".into()),
        Ok(r) => r,
    }
}

/// A job that fails: cases 0-2 are [`mismatch`]'s (with blocking NCCL),
/// case 3 a rank that returns an error after device collectives that
/// worked, while the others wait in the next one. Used by the processes
/// test that every rank then exits by itself, with an error, not a signal.
pub async fn fail(ctx: Context, case: u32) -> R<()> {
    if case < 3 {
        return mismatch(ctx, case, NcclMode::Blocking).await;
    }
    let gpu = Gpu::for_rank(ctx.rank()).map_err(e)?;
    let dc = DeviceComm::new(&ctx, gpu.clone()).await.map_err(e)?;
    let me = ctx.rank();
    let len = 1 << 16;
    let src = DeviceBuffer::from_slice(&gpu, &vec![1i64; len]).map_err(e)?;
    let sum = dev::allreduce(
        &dc,
        &src,
        poisoned(&gpu, len * 8)?,
        DType::I64,
        ReduceKind::Sum,
    )
    .await
    .map_err(e)?;
    let got: Vec<i64> = sum.to_vec().map_err(e)?;
    if got.iter().any(|&v| v != ctx.nranks() as i64) {
        return Err(format!("rank {me}: allreduce gave a wrong sum"));
    }
    if me + 1 == ctx.nranks() {
        return Err(format!(
            "rank {me}: deliberate failure after a device allreduce"
        ));
    }
    let fut = dev::allreduce(
        &dc,
        &src,
        poisoned(&gpu, len * 8)?,
        DType::I64,
        ReduceKind::Sum,
    );
    match tokio::time::timeout(Duration::from_secs(60), fut).await {
        Err(_) => Err("timed out: the allreduce without the failed rank hung".into()),
        Ok(Ok(_)) => Err(format!(
            "rank {me}: an allreduce without the failed rank succeeded"
        )),
        Ok(Err(err)) => Err(format!("rank {me}: {err}")),
    }
}
