//! GPU benchmark (feature `cuda`): every device collective, 1 KiB to 1 GiB,
//! one rank per GPU, next to the same NCCL calls made raw in the same run,
//! and the copy-engine IPC SendRecv (`ipc`) and the SM-driven NVLink
//! SendRecv (`nvlink`) next to NCCL send/recv.
//!
//! Per point (after warm-up; raw and braid are measured alternately twice
//! and each keeps its best; times are the max over ranks):
//! - `raw`: K NCCL calls enqueued back to back on the NCCL thread, timed
//!   with CUDA events (what nccl-tests reports).
//! - `raw sync`: each raw call followed by a stream synchronise, timed on
//!   the host (the latency a caller that waits for each result sees);
//!   the median over calls.
//! - `braid`: K calls of the core API, up to 4 in flight, each output
//!   reused once its call completes (pipelined, comparable to `raw`).
//! - `braid await`: each call awaited before the next (the streaming
//!   wrapper; comparable to `raw sync`); the median over calls.
//!
//! busbw follows nccl-tests: algbw = size / time; allreduce x 2(n-1)/n;
//! allgather, reduce_scatter, alltoall(v) x (n-1)/n; broadcast, sendrecv,
//! halo x 1. `size` is the largest buffer of the call (allgather: the
//! output; reduce_scatter: the input), as in nccl-tests.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use braid_coll::device::{self as dev, Checks, DeviceAllToAllv, DeviceComm, DeviceHaloExchange};
use braid_coll::{DType, Handle, ReduceKind};
use braid_core::cuda::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
use braid_core::cuda::ipc::IpcSendRecv;
use braid_core::cuda::{CudaError, DeviceBuffer, Gpu, NcclDType, NcclMode, NcclOp, NcclWork};
use braid_core::{BoxError, Context, Event, MemoryLimits};
use braid_examples::{JobArgs, JobOutcome, median, outln, run_job, size_name};
use braid_kernels::gpu::{NvlinkConfig, NvlinkSendRecv, Staging};

/// Options of `braid-bench gpu`.
#[derive(Debug, clap::Args)]
pub struct GpuArgs {
    #[command(flatten)]
    job: JobArgs,
    /// Smallest size in bytes.
    #[arg(long, default_value_t = 1 << 10)]
    min: usize,
    /// Largest size in bytes.
    #[arg(long, default_value_t = 1 << 30)]
    max: usize,
    /// Size step factor (at least 2).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(2..))]
    step: u64,
    /// Collectives: allreduce, allgather, reduce_scatter, broadcast,
    /// alltoall, alltoallv, sendrecv, halo, halo_sized, ipc, nvlink.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "allreduce,allgather,reduce_scatter,broadcast,alltoall,alltoallv,sendrecv,halo,halo_sized,ipc"
    )]
    colls: Vec<String>,
    /// Bytes moved per point (bounds the iteration count).
    #[arg(long, default_value_t = 32 << 30)]
    bytes_per_point: usize,
    /// Skip the host agreement checks (`Checks::Off`).
    #[arg(long)]
    no_checks: bool,
    /// Use a non-blocking NCCL communicator (`NcclMode::NonBlocking`).
    #[arg(long)]
    nonblocking: bool,
}

/// One measured point (microseconds per call).
#[derive(Debug, Clone, Copy, Default)]
struct Point {
    raw: f64,
    raw_sync: f64,
    braid: f64,
    braid_await: f64,
}

fn bus_factor(coll: &str, n: usize) -> f64 {
    let n = n as f64;
    match coll {
        "allreduce" => 2.0 * (n - 1.0) / n,
        "allgather" | "reduce_scatter" | "alltoall" | "alltoallv" => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// (input bytes, output bytes) for a call of `size`.
fn shapes(coll: &str, size: usize, n: usize) -> (usize, usize) {
    match coll {
        "allgather" => (size / n, size),
        "reduce_scatter" => (size, size / n),
        _ => (size, size),
    }
}

/// Rounds `size` down to a multiple of 4n (element size x ranks).
fn round(size: usize, n: usize) -> usize {
    (size / (4 * n) * 4 * n).max(4 * n)
}

/// The raw NCCL calls of one operation.
fn raw_call(
    coll: &str,
    w: &NcclWork<'_>,
    input: u64,
    output: u64,
    inlen: usize,
    outlen: usize,
) -> Result<(), CudaError> {
    let n = w.nranks();
    let me = w.rank();
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    match coll {
        "allreduce" => w.all_reduce(input, output, inlen / 4, NcclDType::F32, NcclOp::Sum),
        "allgather" => w.all_gather(input, output, inlen, NcclDType::U8),
        "reduce_scatter" => {
            w.reduce_scatter(input, output, outlen / 4, NcclDType::F32, NcclOp::Sum)
        }
        "broadcast" => w.broadcast(output, output, outlen, NcclDType::U8, 0),
        "alltoall" | "alltoallv" => {
            let blk = inlen / n as usize;
            w.group(|w| {
                for p in 0..n {
                    let off = (p as usize * blk) as u64;
                    w.send(input + off, blk, NcclDType::U8, p)?;
                    w.recv(output + off, blk, NcclDType::U8, p)?;
                }
                Ok(())
            })
        }
        "sendrecv" | "ipc" | "nvlink" => w.group(|w| {
            w.send(input, inlen, NcclDType::U8, right)?;
            w.recv(output, outlen, NcclDType::U8, left)
        }),
        "halo" | "halo_sized" => w.group(|w| {
            if me > 0 {
                w.send(input, inlen, NcclDType::U8, me - 1)?;
                w.recv(output, outlen, NcclDType::U8, me - 1)?;
            }
            if me + 1 < n {
                w.send(input, inlen, NcclDType::U8, me + 1)?;
                w.recv(output, outlen, NcclDType::U8, me + 1)?;
            }
            Ok(())
        }),
        other => Err(CudaError::Invalid {
            rank: me,
            detail: format!("unknown collective {other}"),
        }),
    }
}

/// Raw NCCL: `iters` calls back to back (event-timed) and `iters` calls each
/// synchronised (host-timed). Returns microseconds per call for both.
async fn raw(
    dc: &DeviceComm,
    coll: &'static str,
    input: &DeviceBuffer,
    output: &DeviceBuffer,
    iters: usize,
) -> Result<(f64, f64), BoxError> {
    let (i, o, il, ol) = (input.ptr(), output.ptr(), input.len(), output.len());
    let gpu = dc.gpu().clone();
    let out = Arc::new(Mutex::new((0.0f64, 0.0f64)));
    let out2 = out.clone();
    let done = dc.nccl().submit(
        vec![],
        vec![input.keep_alive(), output.keep_alive()],
        move |w| {
            let rank = w.rank();
            let drv = |e| CudaError::Invalid {
                rank,
                detail: format!("event: {e:?}"),
            };
            let start = gpu
                .context()
                .new_event(Some(CU_EVENT_DEFAULT))
                .map_err(drv)?;
            let end = gpu
                .context()
                .new_event(Some(CU_EVENT_DEFAULT))
                .map_err(drv)?;
            raw_call(coll, w, i, o, il, ol)?; // warm-up
            start.record(w.stream()).map_err(drv)?;
            for _ in 0..iters {
                raw_call(coll, w, i, o, il, ol)?;
            }
            end.record(w.stream()).map_err(drv)?;
            end.synchronize().map_err(drv)?;
            let ms = start.elapsed_ms(&end).map_err(drv)? as f64;
            let mut per = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t = Instant::now();
                raw_call(coll, w, i, o, il, ol)?;
                w.stream().synchronize().map_err(drv)?;
                per.push(t.elapsed().as_secs_f64() * 1e6);
            }
            let sync_us = median(per);
            *out2.lock().unwrap_or_else(|p| p.into_inner()) = (ms * 1e3 / iters as f64, sync_us);
            Ok(())
        },
    );
    done.await?;
    let r = *out.lock().unwrap_or_else(|p| p.into_inner());
    Ok(r)
}

/// A started braid call (SendRecv hands back an `Option`).
enum Started {
    Buf(Handle<DeviceBuffer>),
    Opt(Handle<Option<DeviceBuffer>>),
}

impl Started {
    fn take(self) -> Result<DeviceBuffer, BoxError> {
        match self {
            Started::Buf(h) => Ok(h.take()?),
            Started::Opt(h) => h.take()?.ok_or_else(|| "no output".into()),
        }
    }

    fn wait(self) -> Result<DeviceBuffer, BoxError> {
        match self {
            Started::Buf(h) => Ok(h.wait()?),
            Started::Opt(h) => h.wait()?.ok_or_else(|| "no output".into()),
        }
    }
}

/// Starts one braid call.
fn start_one(
    dc: &DeviceComm,
    coll: &str,
    input: &DeviceBuffer,
    output: DeviceBuffer,
    cb: Option<braid_coll::Callback>,
) -> Started {
    use Started::Buf;
    let n = dc.nranks();
    let me = dc.rank();
    match coll {
        "allreduce" => Buf(dev::start_allreduce(
            dc,
            input,
            output,
            DType::F32,
            ReduceKind::Sum,
            cb,
        )),
        "allgather" => Buf(dev::start_allgather(dc, input, output, cb)),
        "reduce_scatter" => Buf(dev::start_reduce_scatter(
            dc,
            input,
            output,
            DType::F32,
            ReduceKind::Sum,
            cb,
        )),
        "broadcast" => Buf(dev::start_broadcast(dc, output, 0, cb)),
        "alltoall" => Buf(dev::start_alltoall(dc, input, output, cb)),
        "alltoallv" => {
            let blk = input.len() / n as usize;
            let spec = DeviceAllToAllv::packed(vec![blk; n as usize], vec![blk; n as usize]);
            Buf(dev::start_alltoallv(dc, input, output, spec, cb))
        }
        _ => {
            // sendrecv: a ring step.
            let right = (me + 1) % n;
            let left = (me + n - 1) % n;
            Started::Opt(dev::start_sendrecv(
                dc,
                Some((input, right)),
                Some((output, left)),
                cb,
            ))
        }
    }
}

/// Halo rounds with both neighbours, `input` to each: pipelined (up to 4
/// rounds in flight, receive buffers recycled) and awaited one by one.
/// `sized`: receive sizes are known (no size round).
async fn halo(
    dc: &DeviceComm,
    sized: bool,
    input: &DeviceBuffer,
    iters: usize,
) -> Result<(f64, f64), BoxError> {
    const WINDOW: usize = 4;
    let gpu = dc.gpu().clone();
    let me = dc.rank();
    let n = dc.nranks();
    let bufs = |cond: bool| -> Result<Option<DeviceBuffer>, BoxError> {
        Ok(if cond {
            Some(DeviceBuffer::alloc(&gpu, input.len())?)
        } else {
            None
        })
    };
    let start = |recv: (Option<DeviceBuffer>, Option<DeviceBuffer>), cb| {
        let x = DeviceHaloExchange::new(dc);
        if sized {
            x.start_sized(Some(input), Some(input), recv.0, recv.1, cb)
        } else {
            x.start(Some(input), Some(input), cb)
        }
    };
    let mut free: Vec<(Option<DeviceBuffer>, Option<DeviceBuffer>)> = (0..WINDOW)
        .map(|_| Ok((bufs(me > 0)?, bufs(me + 1 < n)?)))
        .collect::<Result<_, BoxError>>()?;
    let t = Instant::now();
    let mut inflight = std::collections::VecDeque::with_capacity(WINDOW);
    for _ in 0..iters {
        let recv = match free.pop() {
            Some(r) => r,
            None => {
                let (ev, h): (Event, Handle<braid_coll::device::DeviceHalo>) =
                    inflight.pop_front().ok_or("window empty")?;
                ev.wait().await;
                let h = h.take()?;
                (h.from_left, h.from_right)
            }
        };
        let ev = Event::new();
        let e2 = ev.clone();
        inflight.push_back((ev, start(recv, Some(Box::new(move || e2.set())))));
    }
    for (ev, h) in inflight {
        ev.wait().await;
        let h = h.take()?;
        free.push((h.from_left, h.from_right));
    }
    let piped = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let mut recv = free.pop().ok_or("no buffers")?;
    drop(free);
    let mut per = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        let x = DeviceHaloExchange::new(dc);
        let h = if sized {
            x.exchange_sized(Some(input), Some(input), recv.0, recv.1)
                .await?
        } else {
            x.exchange(Some(input), Some(input)).await?
        };
        per.push(t.elapsed().as_secs_f64() * 1e6);
        recv = (h.from_left, h.from_right);
    }
    Ok((piped, median(per)))
}

/// One braid call through its streaming wrapper.
async fn await_one(
    dc: &DeviceComm,
    coll: &str,
    input: &DeviceBuffer,
    output: DeviceBuffer,
) -> Result<DeviceBuffer, BoxError> {
    let n = dc.nranks();
    let me = dc.rank();
    Ok(match coll {
        "allreduce" => dev::allreduce(dc, input, output, DType::F32, ReduceKind::Sum).await?,
        "allgather" => dev::allgather(dc, input, output).await?,
        "reduce_scatter" => {
            dev::reduce_scatter(dc, input, output, DType::F32, ReduceKind::Sum).await?
        }
        "broadcast" => dev::broadcast(dc, output, 0).await?,
        "alltoall" => dev::alltoall(dc, input, output).await?,
        "alltoallv" => {
            let blk = input.len() / n as usize;
            let spec = DeviceAllToAllv::packed(vec![blk; n as usize], vec![blk; n as usize]);
            dev::alltoallv(dc, input, output, spec).await?
        }
        _ => {
            let right = (me + 1) % n;
            let left = (me + n - 1) % n;
            dev::sendrecv(dc, Some((input, right)), Some((output, left)))
                .await?
                .ok_or("no output")?
        }
    })
}

async fn braid(
    dc: &DeviceComm,
    coll: &str,
    input: &DeviceBuffer,
    outlen: usize,
    iters: usize,
) -> Result<(f64, f64), BoxError> {
    let gpu = dc.gpu().clone();
    if coll == "halo" || coll == "halo_sized" {
        return halo(dc, coll == "halo_sized", input, iters).await;
    }
    // Warm-up.
    let out = DeviceBuffer::alloc(&gpu, outlen)?;
    let w = start_one(dc, coll, input, out, None);
    tokio::task::block_in_place(|| w.wait())?;
    // Pipelined: up to WINDOW calls in flight, outputs recycled as calls
    // complete (the pattern of a streaming producer; bounded memory).
    const WINDOW: usize = 4;
    let mut free: Vec<DeviceBuffer> = (0..WINDOW.min(iters))
        .map(|_| DeviceBuffer::alloc(&gpu, outlen))
        .collect::<Result<_, _>>()?;
    let t = Instant::now();
    let mut inflight = std::collections::VecDeque::with_capacity(WINDOW);
    for _ in 0..iters {
        let out = match free.pop() {
            Some(o) => o,
            None => {
                let (ev, h): (Event, Started) = inflight.pop_front().ok_or("window empty")?;
                ev.wait().await;
                h.take()?
            }
        };
        let ev = Event::new();
        let e2 = ev.clone();
        inflight.push_back((
            ev,
            start_one(dc, coll, input, out, Some(Box::new(move || e2.set()))),
        ));
    }
    for (ev, h) in inflight {
        ev.wait().await;
        free.push(h.take()?);
    }
    let piped = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let mut out = free.pop().ok_or("no output")?;
    drop(free);
    let mut per = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        out = await_one(dc, coll, input, out).await?;
        per.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let awaited = median(per);
    Ok((piped, awaited))
}

async fn ipc_braid(
    ctx: &Context,
    ipc: &mut IpcSendRecv,
    input: &DeviceBuffer,
    outlen: usize,
    iters: usize,
) -> Result<(f64, f64), BoxError> {
    let n = ctx.nranks();
    let me = ctx.rank();
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let gpu = input.gpu().clone();
    let mut out = DeviceBuffer::alloc(&gpu, outlen)?;
    out = ipc
        .sendrecv(Some((input, right)), Some((out, left)))
        .await?
        .ok_or("no output")?;
    // Pipelined: enqueue all steps into the same buffer, wait for the last.
    let t = Instant::now();
    let mut last = None;
    for _ in 0..iters {
        last = Some(
            ipc.enqueue(Some((input, right)), Some((&out, left)))
                .await?,
        );
    }
    if let Some(ev) = last {
        braid_core::cuda::ipc::wait_event(&ev, ctx.rank(), Some(ctx.comm().as_ref())).await?;
    }
    let piped = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let mut per = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        out = ipc
            .sendrecv(Some((input, right)), Some((out, left)))
            .await?
            .ok_or("no output")?;
        per.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let awaited = median(per);
    Ok((piped, awaited))
}

/// The SM-driven NVLink SendRecv, ring step: pipelined (all steps
/// enqueued, the last awaited) and awaited one by one.
async fn nvlink_braid(
    ctx: &Context,
    nv: &mut NvlinkSendRecv,
    input: &DeviceBuffer,
    outlen: usize,
    iters: usize,
) -> Result<(f64, f64), BoxError> {
    let n = ctx.nranks();
    let me = ctx.rank();
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let gpu = input.gpu().clone();
    let mut out = DeviceBuffer::alloc(&gpu, outlen)?;
    nv.sendrecv(Some((input, right)), Some((&mut out, left)))
        .await?;
    let t = Instant::now();
    let mut last = None;
    for _ in 0..iters {
        last = Some(nv.enqueue(Some((input, right)), Some((&mut out, left)))?);
    }
    if let Some(ev) = last {
        braid_core::cuda::ipc::wait_event(&ev, ctx.rank(), Some(ctx.comm().as_ref())).await?;
        nv.check()?;
    }
    let piped = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let mut per = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        nv.sendrecv(Some((input, right)), Some((&mut out, left)))
            .await?;
        per.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let awaited = median(per);
    Ok((piped, awaited))
}

/// Runs the benchmark.
pub fn run(a: GpuArgs) -> Result<(), BoxError> {
    let colls: Vec<&'static str> = a
        .colls
        .iter()
        .map(|c| -> Result<&'static str, BoxError> {
            const ALL: [&str; 11] = [
                "allreduce",
                "allgather",
                "reduce_scatter",
                "broadcast",
                "alltoall",
                "alltoallv",
                "sendrecv",
                "halo",
                "halo_sized",
                "ipc",
                "nvlink",
            ];
            ALL.iter()
                .copied()
                .find(|x| x == c)
                .ok_or_else(|| format!("unknown collective {c}").into())
        })
        .collect::<Result<_, _>>()?;
    if a.min > a.max {
        return Err(format!("--min {} is above --max {}", a.min, a.max).into());
    }
    let mut sizes = Vec::new();
    let mut s = a.min.max(4);
    while s <= a.max {
        sizes.push(s);
        s = s.saturating_mul(usize::try_from(a.step).unwrap_or(usize::MAX));
    }
    let budget = a.bytes_per_point;
    let mode = if a.nonblocking {
        NcclMode::NonBlocking
    } else {
        NcclMode::Blocking
    };
    let checks = if a.no_checks {
        Checks::Off
    } else {
        Checks::Agree
    };
    let gpus = Gpu::count();
    let out = run_job(&a.job, MemoryLimits::UNLIMITED, move |ctx| {
        let colls = colls.clone();
        let sizes = sizes.clone();
        async move {
            let n = ctx.nranks() as usize;
            let gpu = Gpu::for_rank(ctx.rank())?;
            let dc = DeviceComm::new_with(&ctx, gpu.clone(), mode)
                .await?
                .with_checks(checks);
            let mut ipc = IpcSendRecv::new(&ctx, gpu.clone()).await?;
            let mut nv = if colls.contains(&"nvlink") {
                // BRAID_NVLINK_BLOCKS / _SLOTS / _SLOT_KIB / _PULL override the shape.
                let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
                let d = NvlinkConfig::default();
                let config = NvlinkConfig {
                    blocks: env("BRAID_NVLINK_BLOCKS").unwrap_or(d.blocks),
                    slots: env("BRAID_NVLINK_SLOTS").unwrap_or(d.slots),
                    slot_bytes: env("BRAID_NVLINK_SLOT_KIB").map_or(d.slot_bytes, |k| k * 1024),
                    staging: match env("BRAID_NVLINK_PULL") {
                        Some(1) => Staging::AtSender,
                        Some(_) => Staging::AtReceiver,
                        None => d.staging,
                    },
                };
                Some(NvlinkSendRecv::with_config(&ctx, gpu.clone(), config).await?)
            } else {
                None
            };
            let mut rows: Vec<(String, usize, Point)> = Vec::new();
            for &coll in &colls {
                for &size in &sizes {
                    let size = round(size, n);
                    let (inlen, outlen) = shapes(coll, size, n);
                    let iters = (budget / size).clamp(5, 200);
                    let mut input = DeviceBuffer::alloc(&gpu, inlen)?;
                    input.fill(0x3c)?;
                    let mut output = DeviceBuffer::alloc(&gpu, outlen)?;
                    output.fill(0)?;
                    // Raw and braid alternate twice; each keeps its best
                    // (so slow drift of the machine favours neither).
                    let (mut raw_t, mut raw_sync, mut b, mut ba) =
                        (f64::MAX, f64::MAX, f64::MAX, f64::MAX);
                    for _ in 0..2 {
                        braid_coll::barrier(&ctx).await?;
                        let (r, rs) = raw(&dc, coll, &input, &output, iters).await?;
                        braid_coll::barrier(&ctx).await?;
                        let (x, xa) = if coll == "ipc" {
                            ipc_braid(&ctx, &mut ipc, &input, outlen, iters).await?
                        } else if let (Some(nv), "nvlink") = (nv.as_mut(), coll) {
                            nvlink_braid(&ctx, nv, &input, outlen, iters).await?
                        } else {
                            braid(&dc, coll, &input, outlen, iters).await?
                        };
                        raw_t = raw_t.min(r);
                        raw_sync = raw_sync.min(rs);
                        b = b.min(x);
                        ba = ba.min(xa);
                    }
                    let mx =
                        braid_coll::allreduce(&ctx, vec![raw_t, raw_sync, b, ba], ReduceKind::Max)
                            .await?;
                    rows.push((
                        coll.to_string(),
                        size,
                        Point {
                            raw: mx[0],
                            raw_sync: mx[1],
                            braid: mx[2],
                            braid_await: mx[3],
                        },
                    ));
                    drop((input, output));
                    gpu.trim();
                }
            }
            Ok((rows, gpu.context().name().unwrap_or_default()))
        }
    })?;
    let JobOutcome::Ran(results) = out else {
        return Ok(());
    };
    let Some((rank, (rows, name))) = results.into_iter().next() else {
        return Ok(());
    };
    if rank != 0 {
        return Ok(());
    }
    let n = a.job.ranks() as usize;
    outln!(
        "braid-bench gpu: {n} ranks ({:?} backend), {name}, {gpus} GPU(s) visible; checks {}; NCCL {:?}",
        a.job.backend(),
        if a.no_checks { "off" } else { "on" },
        if a.nonblocking {
            NcclMode::NonBlocking
        } else {
            NcclMode::Blocking
        }
    );
    outln!(
        "times in us per call (max over ranks; raw sync and braid await are medians of single calls); busbw in GB/s; ratio = braid busbw / raw busbw; added = braid await - raw sync"
    );
    outln!(
        "{:<15} {:>9} {:>10} {:>10} {:>10} {:>11} {:>9} {:>9} {:>7} {:>8}",
        "coll",
        "size",
        "raw",
        "raw sync",
        "braid",
        "braid await",
        "raw bw",
        "braid bw",
        "ratio",
        "added"
    );
    for (coll, size, p) in rows {
        let f = bus_factor(&coll, n);
        let bw = |us: f64| size as f64 / (us * 1e-6) / 1e9 * f;
        let baseline = if coll == "ipc" || coll == "nvlink" {
            "nccl"
        } else {
            ""
        };
        outln!(
            "{:<15} {:>9} {:>10.2} {:>10.2} {:>10.2} {:>11.2} {:>9.2} {:>9.2} {:>7.3} {:>8.2} {baseline}",
            coll,
            size_name(size),
            p.raw,
            p.raw_sync,
            p.braid,
            p.braid_await,
            bw(p.raw),
            bw(p.braid),
            bw(p.braid) / bw(p.raw),
            p.braid_await - p.raw_sync
        );
    }
    Ok(())
}
