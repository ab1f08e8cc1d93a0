//! Broadcast, AllGather, AllReduce, ReduceScatter and AllToAll on device
//! buffers: one NCCL call each (AllToAll: a group of sends and receives).
//!
//! Every function takes its inputs by reference (kept alive until the work
//! completes) and its output by value, and hands the output back written.
//! Lengths are in bytes and are validated before anything is enqueued.

use braid_core::Rank;
use braid_core::cuda::{DeviceBuffer, GpuEvent};
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

fn written(mut out: DeviceBuffer) -> impl FnOnce(GpuEvent) -> DeviceBuffer {
    move |ev| {
        out.set_ready(ev);
        out
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
    let site = Site::next(dc.ctx(), CollKind::Broadcast);
    if root >= dc.nranks() {
        let e = site.invalid(format!(
            "root {root} out of range (nranks = {})",
            dc.nranks()
        ));
        return failed(dc, site, e, callback);
    }
    if let Err(e) = same_gpu(dc, &site, &buf) {
        return failed(dc, site, e, callback);
    }
    let sig = Signature {
        dtype: DType::Bytes,
        aux: root,
        count: buf.len() as u64,
    };
    let (ptr, len) = (buf.ptr(), buf.len());
    let waits = buf.ready().cloned().into_iter().collect();
    run(
        dc,
        site,
        sig,
        waits,
        vec![],
        move |w| w.broadcast(ptr, ptr, len, nccl_dtype(DType::Bytes), root),
        written(buf),
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
    let site = Site::next(dc.ctx(), CollKind::AllGather);
    let n = dc.nranks() as usize;
    let check = (|| {
        same_gpu(dc, &site, input)?;
        same_gpu(dc, &site, &output)?;
        if input.len().checked_mul(n) != Some(output.len()) {
            return Err(site.invalid(format!(
                "output has {} bytes, expected {} ranks x {} bytes",
                output.len(),
                n,
                input.len()
            )));
        }
        Ok(())
    })();
    if let Err(e) = check {
        return failed(dc, site, e, callback);
    }
    let sig = Signature {
        dtype: DType::Bytes,
        aux: 0,
        count: input.len() as u64,
    };
    let (src, dst, len) = (input.ptr(), output.ptr(), input.len());
    let waits = input
        .ready()
        .into_iter()
        .chain(output.ready())
        .cloned()
        .collect();
    run(
        dc,
        site,
        sig,
        waits,
        vec![input.keep_alive()],
        move |w| w.all_gather(src, dst, len, nccl_dtype(DType::Bytes)),
        written(output),
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
    let site = Site::next(dc.ctx(), CollKind::AllReduce);
    let check = (|| {
        same_gpu(dc, &site, input)?;
        same_gpu(dc, &site, &output)?;
        if dtype == DType::Bytes {
            return Err(site.invalid("AllReduce needs a numeric element type"));
        }
        if input.len() != output.len() {
            return Err(site.invalid(format!(
                "input has {} bytes, output {}",
                input.len(),
                output.len()
            )));
        }
        elements(&site, "input", input.len(), dtype)
    })();
    let count = match check {
        Ok(c) => c,
        Err(e) => return failed(dc, site, e, callback),
    };
    let sig = Signature {
        dtype,
        aux: op as u32,
        count: count as u64,
    };
    let (src, dst) = (input.ptr(), output.ptr());
    let waits = input
        .ready()
        .into_iter()
        .chain(output.ready())
        .cloned()
        .collect();
    run(
        dc,
        site,
        sig,
        waits,
        vec![input.keep_alive()],
        move |w| w.all_reduce(src, dst, count, nccl_dtype(dtype), nccl_op(op)),
        written(output),
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
    let site = Site::next(dc.ctx(), CollKind::ReduceScatter);
    let n = dc.nranks() as usize;
    let check = (|| {
        same_gpu(dc, &site, input)?;
        same_gpu(dc, &site, &output)?;
        if dtype == DType::Bytes {
            return Err(site.invalid("ReduceScatter needs a numeric element type"));
        }
        if output.len().checked_mul(n) != Some(input.len()) {
            return Err(site.invalid(format!(
                "input has {} bytes, expected {} ranks x {} output bytes",
                input.len(),
                n,
                output.len()
            )));
        }
        elements(&site, "output", output.len(), dtype)
    })();
    let count = match check {
        Ok(c) => c,
        Err(e) => return failed(dc, site, e, callback),
    };
    let sig = Signature {
        dtype,
        aux: op as u32,
        count: count as u64,
    };
    let (src, dst) = (input.ptr(), output.ptr());
    let waits = input
        .ready()
        .into_iter()
        .chain(output.ready())
        .cloned()
        .collect();
    run(
        dc,
        site,
        sig,
        waits,
        vec![input.keep_alive()],
        move |w| w.reduce_scatter(src, dst, count, nccl_dtype(dtype), nccl_op(op)),
        written(output),
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
    let site = Site::next(dc.ctx(), CollKind::AllToAll);
    let n = dc.nranks() as usize;
    let check = (|| {
        same_gpu(dc, &site, input)?;
        same_gpu(dc, &site, &output)?;
        if input.len() != output.len() || input.len() % n != 0 {
            return Err(site.invalid(format!(
                "input ({} bytes) and output ({} bytes) must be equal and a multiple of {n} ranks",
                input.len(),
                output.len()
            )));
        }
        Ok(input.len() / n)
    })();
    let block = match check {
        Ok(b) => b,
        Err(e) => return failed(dc, site, e, callback),
    };
    let sig = Signature {
        dtype: DType::Bytes,
        aux: 0,
        count: block as u64,
    };
    let (src, dst) = (input.ptr(), output.ptr());
    let waits = input
        .ready()
        .into_iter()
        .chain(output.ready())
        .cloned()
        .collect();
    run(
        dc,
        site,
        sig,
        waits,
        vec![input.keep_alive()],
        move |w| {
            w.group(|w| {
                for p in 0..w.nranks() {
                    let off = (p as usize * block) as u64;
                    w.send(src + off, block, nccl_dtype(DType::Bytes), p)?;
                    w.recv(dst + off, block, nccl_dtype(DType::Bytes), p)?;
                }
                Ok(())
            })
        },
        written(output),
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
