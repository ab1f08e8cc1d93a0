//! Element-wise kernels: gather, hash partition, order keys.

use std::sync::Arc;

use braid_core::cuda::cudarc::driver::PushKernelArg;
use braid_core::cuda::{DeviceBuffer, Gpu};

use super::launch::{KernelError, Kernels, grid, launched};

fn invalid(gpu: &Gpu, kernel: &'static str, detail: String) -> KernelError {
    KernelError::Invalid {
        rank: gpu.rank(),
        kernel,
        detail,
    }
}

/// Orders the `Gpu`'s stream after every outstanding use of `buffers`
/// (inputs and outputs alike): an output, even a fresh one from the pool,
/// may still be read by work on another stream; for an input this waits a
/// little more than its latest write, which costs only overlap.
pub(crate) fn wait_inputs(gpu: &Gpu, buffers: &[&DeviceBuffer]) -> Result<(), KernelError> {
    for b in buffers {
        b.wait_writable(gpu.stream())?;
    }
    Ok(())
}

/// Records the work just enqueued: inputs read, outputs written.
pub(crate) fn mark_written(
    gpu: &Gpu,
    inputs: &[&DeviceBuffer],
    outputs: &mut [&mut DeviceBuffer],
) -> Result<(), KernelError> {
    let ev = gpu.record(gpu.stream())?;
    for b in inputs {
        b.note_use(ev.clone());
    }
    for b in outputs.iter_mut() {
        b.set_ready(ev.clone());
    }
    Ok(())
}

/// `out[i] = input[idx[i]]` for elements of `width` bytes (1, 2, 4 or 8);
/// `idx` holds u32 indices, all below the input's element count (checked by
/// the kernel's caller contract: indices come from a permutation).
pub fn gather(
    gpu: &Arc<Gpu>,
    input: &DeviceBuffer,
    width: usize,
    idx: &DeviceBuffer,
) -> Result<DeviceBuffer, KernelError> {
    let name = match width {
        1 => "gather_u8",
        2 => "gather_u16",
        4 => "gather_u32",
        8 => "gather_u64",
        w => {
            return Err(invalid(
                gpu,
                "gather",
                format!("element width {w} (1, 2, 4 or 8)"),
            ));
        }
    };
    if input.len() % width != 0 || idx.len() % 4 != 0 {
        return Err(invalid(
            gpu,
            "gather",
            format!(
                "{} input bytes / {} index bytes are not whole elements",
                input.len(),
                idx.len()
            ),
        ));
    }
    let n = (idx.len() / 4) as u64;
    let mut out = DeviceBuffer::alloc(gpu, n as usize * width)?;
    if n == 0 {
        return Ok(out);
    }
    let k = Kernels::get(gpu)?;
    let f = k.func(gpu.rank(), name)?;
    wait_inputs(gpu, &[input, idx, &out])?;
    let (i, x, o) = (input.ptr(), idx.ptr(), out.ptr());
    let mut b = gpu.stream().launch_builder(f);
    b.arg(&i).arg(&x).arg(&o).arg(&n);
    // SAFETY: pointers to live buffers of the checked lengths.
    launched(gpu.rank(), unsafe { b.launch(grid(n as usize)) })?;
    mark_written(gpu, &[input, idx], &mut [&mut out])?;
    Ok(out)
}

/// Partition ids (u32, `mix64(key) % nparts`) of i64 keys, and the number
/// of keys per partition (u32).
pub fn hash_partition(
    gpu: &Arc<Gpu>,
    keys: &DeviceBuffer,
    nparts: u32,
) -> Result<(DeviceBuffer, DeviceBuffer), KernelError> {
    if nparts == 0 || keys.len() % 8 != 0 {
        return Err(invalid(
            gpu,
            "hash_partition",
            format!("{nparts} partitions of {} key bytes", keys.len()),
        ));
    }
    let n = (keys.len() / 8) as u64;
    let mut part = DeviceBuffer::alloc(gpu, n as usize * 4)?;
    let mut counts = DeviceBuffer::alloc(gpu, nparts as usize * 4)?;
    counts.fill(0)?;
    if n > 0 {
        let k = Kernels::get(gpu)?;
        let f = k.func(gpu.rank(), "hash_partition_i64")?;
        wait_inputs(gpu, &[keys, &part, &counts])?;
        let (kp, pp, cp) = (keys.ptr(), part.ptr(), counts.ptr());
        let mut b = gpu.stream().launch_builder(f);
        b.arg(&kp).arg(&n).arg(&nparts).arg(&pp).arg(&cp);
        // SAFETY: as above.
        launched(gpu.rank(), unsafe { b.launch(grid(n as usize)) })?;
    }
    mark_written(gpu, &[keys], &mut [&mut part, &mut counts])?;
    Ok((part, counts))
}

fn order_key(
    gpu: &Arc<Gpu>,
    input: &DeviceBuffer,
    name: &'static str,
) -> Result<DeviceBuffer, KernelError> {
    if input.len() % 8 != 0 {
        return Err(invalid(
            gpu,
            name,
            format!("{} bytes are not whole 8-byte values", input.len()),
        ));
    }
    let n = (input.len() / 8) as u64;
    let mut out = DeviceBuffer::alloc(gpu, input.len())?;
    if n > 0 {
        let k = Kernels::get(gpu)?;
        let f = k.func(gpu.rank(), name)?;
        wait_inputs(gpu, &[input, &out])?;
        let (i, o) = (input.ptr(), out.ptr());
        let mut b = gpu.stream().launch_builder(f);
        b.arg(&i).arg(&o).arg(&n);
        // SAFETY: as above.
        launched(gpu.rank(), unsafe { b.launch(grid(n as usize)) })?;
    }
    mark_written(gpu, &[input], &mut [&mut out])?;
    Ok(out)
}

/// u64 keys whose unsigned order is the i64 values' order.
pub fn order_key_i64(gpu: &Arc<Gpu>, input: &DeviceBuffer) -> Result<DeviceBuffer, KernelError> {
    order_key(gpu, input, "order_key_i64")
}

/// u64 keys whose unsigned order is the f64 values' order as DuckDB and
/// Polars sort: -0.0 ties with 0.0, every NaN last (one key).
pub fn order_key_f64(gpu: &Arc<Gpu>, input: &DeviceBuffer) -> Result<DeviceBuffer, KernelError> {
    order_key(gpu, input, "order_key_f64")
}

/// For each query q: the first index of `sorted` (ascending u64) whose
/// value is >= q. Returns one u64 per query.
pub fn lower_bound(
    gpu: &Arc<Gpu>,
    sorted: &DeviceBuffer,
    queries: &DeviceBuffer,
) -> Result<DeviceBuffer, KernelError> {
    if sorted.len() % 8 != 0 || queries.len() % 8 != 0 {
        return Err(invalid(
            gpu,
            "lower_bound",
            format!(
                "{} sorted bytes / {} query bytes are not whole u64",
                sorted.len(),
                queries.len()
            ),
        ));
    }
    let (n, m) = ((sorted.len() / 8) as u64, (queries.len() / 8) as u64);
    let mut out = DeviceBuffer::alloc(gpu, queries.len())?;
    if m > 0 {
        let k = Kernels::get(gpu)?;
        let f = k.func(gpu.rank(), "lower_bound_u64")?;
        wait_inputs(gpu, &[sorted, queries, &out])?;
        let (sp, qp, op) = (sorted.ptr(), queries.ptr(), out.ptr());
        let mut b = gpu.stream().launch_builder(f);
        b.arg(&sp).arg(&n).arg(&qp).arg(&m).arg(&op);
        // SAFETY: live buffers of the checked lengths.
        launched(gpu.rank(), unsafe { b.launch(grid(m as usize)) })?;
    }
    mark_written(gpu, &[sorted, queries], &mut [&mut out])?;
    Ok(out)
}

/// `0, 1, ..., n - 1` as u32 (the identity permutation a sort starts from).
pub fn iota(gpu: &Arc<Gpu>, n: usize) -> Result<DeviceBuffer, KernelError> {
    if n > u32::MAX as usize {
        return Err(invalid(
            gpu,
            "iota",
            format!("{n} elements (at most 2^32 - 1)"),
        ));
    }
    let mut out = DeviceBuffer::alloc(gpu, n * 4)?;
    if n > 0 {
        let k = Kernels::get(gpu)?;
        let f = k.func(gpu.rank(), "iota_u32")?;
        wait_inputs(gpu, &[&out])?;
        let (o, n64) = (out.ptr(), n as u64);
        let mut b = gpu.stream().launch_builder(f);
        b.arg(&o).arg(&n64);
        // SAFETY: `n` u32 out.
        launched(gpu.rank(), unsafe { b.launch(grid(n)) })?;
    }
    mark_written(gpu, &[], &mut [&mut out])?;
    Ok(out)
}

/// `base, base + 1, ..., base + n - 1` as i64 (row numbers made on the
/// device instead of uploaded).
pub fn iota_i64(gpu: &Arc<Gpu>, base: i64, n: usize) -> Result<DeviceBuffer, KernelError> {
    if base.checked_add(n as i64).is_none() || n > i64::MAX as usize {
        return Err(invalid(
            gpu,
            "iota_i64",
            format!("{n} values from {base} pass i64's range"),
        ));
    }
    let mut out = DeviceBuffer::alloc(gpu, n * 8)?;
    if n > 0 {
        let k = Kernels::get(gpu)?;
        let f = k.func(gpu.rank(), "iota_i64")?;
        wait_inputs(gpu, &[&out])?;
        let (o, n64) = (out.ptr(), n as u64);
        let mut b = gpu.stream().launch_builder(f);
        b.arg(&o).arg(&base).arg(&n64);
        // SAFETY: `n` i64 out.
        launched(gpu.rank(), unsafe { b.launch(grid(n)) })?;
    }
    mark_written(gpu, &[], &mut [&mut out])?;
    Ok(out)
}
