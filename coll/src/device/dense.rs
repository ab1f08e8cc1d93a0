//! Broadcast, AllGather, AllReduce, ReduceScatter and AllToAll on device
//! buffers: one NCCL call each (AllToAll: a group of sends and receives).
//!
//! Every function takes its inputs by reference (kept alive until the work
//! completes) and its output by value, and hands the output back written.
//! Lengths are in bytes and are validated before anything is enqueued.

use braid_core::Rank;
use braid_core::cuda::{CudaError, DeviceBuffer, NcclWork};
use braid_kernels::{DType, ReduceKind};

use super::{DeviceComm, failed, nccl_dtype, nccl_op, run, same_gpu, streaming};
use crate::error::{CollError, CollKind, Site};
use crate::handle::{Callback, Handle};
use crate::wire::Signature;

fn elements(site: &Site, what: &str, len: usize, dtype: DType) -> Result<usize, CollError> {
    let sz = dtype.size().max(1);
    if len % sz != 0 {
        return Err(site.invalid(format!(
            "{what} has {len} bytes, not a whole number of {dtype} elements"
        )));
    }
    Ok(len / sz)
}

/// What a one-call collective enqueues: the NCCL call on (input pointer,
/// output pointer, element count).
type Call = fn(&NcclWork<'_>, u64, u64, usize, DType, ReduceKind, Rank) -> Result<(), CudaError>;

/// The arguments of one call, as validated.
struct Shape {
    /// Element count the NCCL call takes.
    count: usize,
    /// What every rank must agree on.
    sig: Signature,
}

/// The shared body of the one-call collectives: validate (buffers on the
/// communicator's GPU, then `shape`), then enqueue `call` after the
/// buffers' latest writes, keep the input alive until it completes, and
/// hand the output back written.
#[allow(clippy::too_many_arguments)]
fn one_call(
    dc: &DeviceComm,
    coll: CollKind,
    input: Option<&DeviceBuffer>,
    output: DeviceBuffer,
    shape: impl FnOnce(&Site) -> Result<Shape, CollError>,
    call: Call,
    (dtype, op, root): (DType, ReduceKind, Rank),
    callback: Option<Callback>,
) -> Handle<DeviceBuffer> {
    let site = Site::next(dc.ctx(), coll);
    let valid = (|| {
        if let Some(i) = input {
            same_gpu(dc, &site, i)?;
        }
        same_gpu(dc, &site, &output)?;
        shape(&site)
    })();
    let Shape { count, sig } = match valid {
        Ok(s) => s,
        Err(e) => return failed(dc, site, e, callback),
    };
    let dst = output.ptr();
    let src = input.map_or(dst, |i| i.ptr());
    let mut waits: Vec<_> = input.and_then(|i| i.ready()).into_iter().cloned().collect();
    waits.extend(output.write_waits());
    let keep = input.map(|i| i.keep_alive()).into_iter().collect();
    let mut output = output;
    run(
        dc,
        site,
        sig,
        waits,
        keep,
        move |w| call(w, src, dst, count, dtype, op, root),
        move |ev| {
            output.set_ready(ev);
            output
        },
        callback,
    )
}

fn numeric(site: &Site, dtype: DType) -> Result<(), CollError> {
    if dtype == DType::Bytes {
        return Err(site.invalid(format!("{} needs a numeric element type", site.coll)));
    }
    Ok(())
}

fn bytes_sig(count: usize, aux: u32) -> Signature {
    Signature {
        dtype: DType::Bytes,
        aux,
        count: count as u64,
    }
}

/// Core of [`broadcast`]: `buf` (same length on every rank) is replaced by
/// the root's bytes.
pub fn start_broadcast(
    dc: &DeviceComm,
    buf: DeviceBuffer,
    root: Rank,
    callback: Option<Callback>,
) -> Handle<DeviceBuffer> {
    let (n, len) = (dc.nranks(), buf.len());
    one_call(
        dc,
        CollKind::Broadcast,
        None,
        buf,
        |site| {
            if root >= n {
                return Err(site.invalid(format!("root {root} out of range (nranks = {n})")));
            }
            Ok(Shape {
                count: len,
                sig: bytes_sig(len, root),
            })
        },
        |w, _, dst, count, _, _, root| w.broadcast(dst, dst, count, nccl_dtype(DType::Bytes), root),
        (DType::Bytes, ReduceKind::Sum, root),
        callback,
    )
}

/// Broadcast from `root`, in place.
pub async fn broadcast(
    dc: &DeviceComm,
    buf: DeviceBuffer,
    root: Rank,
) -> Result<DeviceBuffer, CollError> {
    streaming(|cb| start_broadcast(dc, buf, root, cb)).await
}

/// Core of [`allgather`]: `output` (N times `input`'s length) receives every
/// rank's `input` in rank order.
pub fn start_allgather(
    dc: &DeviceComm,
    input: &DeviceBuffer,
    output: DeviceBuffer,
    callback: Option<Callback>,
) -> Handle<DeviceBuffer> {
    let n = dc.nranks() as usize;
    let (il, ol) = (input.len(), output.len());
    one_call(
        dc,
        CollKind::AllGather,
        Some(input),
        output,
        |site| {
            if il.checked_mul(n) != Some(ol) {
                return Err(site.invalid(format!(
                    "output has {ol} bytes, expected {n} ranks x {il} bytes"
                )));
            }
            Ok(Shape {
                count: il,
                sig: bytes_sig(il, 0),
            })
        },
        |w, src, dst, count, _, _, _| w.all_gather(src, dst, count, nccl_dtype(DType::Bytes)),
        (DType::Bytes, ReduceKind::Sum, 0),
        callback,
    )
}

/// AllGather: every rank's `input`, in rank order, into `output`.
pub async fn allgather(
    dc: &DeviceComm,
    input: &DeviceBuffer,
    output: DeviceBuffer,
) -> Result<DeviceBuffer, CollError> {
    streaming(|cb| start_allgather(dc, input, output, cb)).await
}

/// Core of [`allreduce`].
pub fn start_allreduce(
    dc: &DeviceComm,
    input: &DeviceBuffer,
    output: DeviceBuffer,
    dtype: DType,
    op: ReduceKind,
    callback: Option<Callback>,
) -> Handle<DeviceBuffer> {
    let (il, ol) = (input.len(), output.len());
    one_call(
        dc,
        CollKind::AllReduce,
        Some(input),
        output,
        |site| {
            numeric(site, dtype)?;
            if il != ol {
                return Err(site.invalid(format!("input has {il} bytes, output {ol}")));
            }
            let count = elements(site, "input", il, dtype)?;
            let sig = Signature {
                dtype,
                aux: op as u32,
                count: count as u64,
            };
            Ok(Shape { count, sig })
        },
        |w, src, dst, count, dtype, op, _| {
            w.all_reduce(src, dst, count, nccl_dtype(dtype), nccl_op(op))
        },
        (dtype, op, 0),
        callback,
    )
}

/// AllReduce of `input` (elements of `dtype`) with `op` into `output`;
/// every rank gets the same bits.
pub async fn allreduce(
    dc: &DeviceComm,
    input: &DeviceBuffer,
    output: DeviceBuffer,
    dtype: DType,
    op: ReduceKind,
) -> Result<DeviceBuffer, CollError> {
    streaming(|cb| start_allreduce(dc, input, output, dtype, op, cb)).await
}

/// Core of [`reduce_scatter`].
pub fn start_reduce_scatter(
    dc: &DeviceComm,
    input: &DeviceBuffer,
    output: DeviceBuffer,
    dtype: DType,
    op: ReduceKind,
    callback: Option<Callback>,
) -> Handle<DeviceBuffer> {
    let n = dc.nranks() as usize;
    let (il, ol) = (input.len(), output.len());
    one_call(
        dc,
        CollKind::ReduceScatter,
        Some(input),
        output,
        |site| {
            numeric(site, dtype)?;
            if ol.checked_mul(n) != Some(il) {
                return Err(site.invalid(format!(
                    "input has {il} bytes, expected {n} ranks x {ol} output bytes"
                )));
            }
            let count = elements(site, "output", ol, dtype)?;
            let sig = Signature {
                dtype,
                aux: op as u32,
                count: count as u64,
            };
            Ok(Shape { count, sig })
        },
        |w, src, dst, count, dtype, op, _| {
            w.reduce_scatter(src, dst, count, nccl_dtype(dtype), nccl_op(op))
        },
        (dtype, op, 0),
        callback,
    )
}

/// ReduceScatter: rank r gets block r (`output.len()` bytes) of the
/// reduction over ranks of `input`.
pub async fn reduce_scatter(
    dc: &DeviceComm,
    input: &DeviceBuffer,
    output: DeviceBuffer,
    dtype: DType,
    op: ReduceKind,
) -> Result<DeviceBuffer, CollError> {
    streaming(|cb| start_reduce_scatter(dc, input, output, dtype, op, cb)).await
}

/// Core of [`alltoall`].
pub fn start_alltoall(
    dc: &DeviceComm,
    input: &DeviceBuffer,
    output: DeviceBuffer,
    callback: Option<Callback>,
) -> Handle<DeviceBuffer> {
    let n = dc.nranks() as usize;
    let (il, ol) = (input.len(), output.len());
    one_call(
        dc,
        CollKind::AllToAll,
        Some(input),
        output,
        |site| {
            if il != ol || il % n != 0 {
                return Err(site.invalid(format!(
                    "input ({il} bytes) and output ({ol} bytes) must be equal and a multiple of {n} ranks"
                )));
            }
            Ok(Shape {
                count: il / n,
                sig: bytes_sig(il / n, 0),
            })
        },
        |w, src, dst, block, _, _, _| {
            w.group(|w| {
                for p in 0..w.nranks() {
                    let off = (p as usize * block) as u64;
                    w.send(src + off, block, nccl_dtype(DType::Bytes), p)?;
                    w.recv(dst + off, block, nccl_dtype(DType::Bytes), p)?;
                }
                Ok(())
            })
        },
        (DType::Bytes, ReduceKind::Sum, 0),
        callback,
    )
}

/// AllToAll with equal blocks: block p of `input` goes to rank p, block q
/// of `output` comes from rank q.
pub async fn alltoall(
    dc: &DeviceComm,
    input: &DeviceBuffer,
    output: DeviceBuffer,
) -> Result<DeviceBuffer, CollError> {
    streaming(|cb| start_alltoall(dc, input, output, cb)).await
}
