//! Stable LSD radix sort of u64 keys with a u32 payload permutation.
//!
//! ```text
//!   u64_min_max          one read: bytes above the highest one where min
//!                        and max differ are the same in every key: skipped
//!   per remaining pass:  radix_histogram -> radix_row_totals
//!                        -> radix_scan_digits -> radix_scatter
//! ```
//!
//! Cost per pass: keys read twice, keys and payload written once; the
//! scatter ranks each 4096-key tile in shared memory and writes it in digit
//! order, so its writes are runs of consecutive addresses, not one
//! transaction per key. Timestamps share their high bytes, so their sorts
//! skip most passes. Memory: keys and payload twice, 256 counters per tile.
//! One device-to-host copy of 16 bytes (min and max) per sort.

use std::sync::Arc;

use braid_core::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use braid_core::cuda::{DeviceBuffer, Gpu};

use super::launch::{KernelError, Kernels, grid, launched};
use super::ops::{mark_written, wait_inputs};

const TILE: usize = 256 * 16;

/// Sorts `keys` (u64, ascending, stable) and applies the same moves to
/// `perm` (u32; pass 0..n for the sorting permutation). Returns the sorted
/// keys and the permuted payload.
pub fn radix_sort(
    gpu: &Arc<Gpu>,
    keys: DeviceBuffer,
    perm: DeviceBuffer,
) -> Result<(DeviceBuffer, DeviceBuffer), KernelError> {
    let rank = gpu.rank();
    if keys.len() % 8 != 0 || perm.len() * 2 != keys.len() {
        return Err(KernelError::Invalid {
            rank,
            kernel: "radix_sort",
            detail: format!("{} key bytes and {} payload bytes", keys.len(), perm.len()),
        });
    }
    let n = keys.len() / 8;
    if n > u32::MAX as usize {
        return Err(KernelError::Invalid {
            rank,
            kernel: "radix_sort",
            detail: format!("{n} keys (at most 2^32 - 1)"),
        });
    }
    if n <= 1 {
        return Ok((keys, perm));
    }
    let k = Kernels::get(gpu)?;
    let minmax_f = k.func(rank, "u64_min_max")?;
    let hist_f = k.func(rank, "radix_histogram")?;
    let totals_f = k.func(rank, "radix_row_totals")?;
    let scan_f = k.func(rank, "radix_scan_digits")?;
    let scatter_f = k.func(rank, "radix_scatter")?;
    let nblocks = n.div_ceil(TILE) as u32;
    let hist = DeviceBuffer::alloc(gpu, 256 * nblocks as usize * 4)?;
    let totals = DeviceBuffer::alloc(gpu, 256 * 4)?;
    let mut range = DeviceBuffer::from_slice(gpu, &[u64::MAX, 0u64])?;
    let (mut ka, mut pa) = (keys, perm);
    let mut kb = DeviceBuffer::alloc(gpu, n * 8)?;
    let mut pb = DeviceBuffer::alloc(gpu, n * 4)?;
    wait_inputs(gpu, &[&ka, &pa, &kb, &pb, &hist, &totals, &range])?;
    let s = gpu.stream();
    let n64 = n as u64;
    // Bytes above the highest one where min and max differ are shared by
    // every key: their passes would move nothing.
    {
        let (kp, rp) = (ka.ptr(), range.ptr());
        let mut cfg = grid(n);
        cfg.grid_dim.0 = cfg.grid_dim.0.min(2048);
        let mut b = s.launch_builder(minmax_f);
        b.arg(&kp).arg(&n64).arg(&rp);
        // SAFETY: live buffers of the checked sizes.
        launched(rank, unsafe { b.launch(cfg) })?;
    }
    let ev = gpu.record(s)?;
    range.set_ready(ev.clone());
    ka.note_use(ev);
    let mm: Vec<u64> = range.to_vec()?;
    let differ = mm[0] ^ mm[1];
    let passes = if differ == 0 {
        0
    } else {
        (64 - differ.leading_zeros()).div_ceil(8)
    };
    let tiles = LaunchConfig {
        grid_dim: (nblocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let per_digit = LaunchConfig {
        grid_dim: (256, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    };
    for pass in 0..passes {
        let shift = pass * 8;
        let (kp, hp, tp) = (ka.ptr(), hist.ptr(), totals.ptr());
        let mut b = s.launch_builder(hist_f);
        b.arg(&kp).arg(&n64).arg(&shift).arg(&hp).arg(&nblocks);
        // SAFETY: live buffers of the checked sizes.
        launched(rank, unsafe { b.launch(tiles) })?;
        let mut b = s.launch_builder(totals_f);
        b.arg(&hp).arg(&nblocks).arg(&tp);
        // SAFETY: as above.
        launched(rank, unsafe { b.launch(per_digit) })?;
        let mut b = s.launch_builder(scan_f);
        b.arg(&hp).arg(&nblocks).arg(&tp);
        // SAFETY: as above.
        launched(rank, unsafe { b.launch(per_digit) })?;
        let (vp, ko, vo) = (pa.ptr(), kb.ptr(), pb.ptr());
        let mut b = s.launch_builder(scatter_f);
        b.arg(&kp)
            .arg(&vp)
            .arg(&n64)
            .arg(&shift)
            .arg(&hp)
            .arg(&nblocks)
            .arg(&ko)
            .arg(&vo);
        // SAFETY: as above; outputs are distinct from inputs.
        launched(rank, unsafe { b.launch(tiles) })?;
        std::mem::swap(&mut ka, &mut kb);
        std::mem::swap(&mut pa, &mut pb);
    }
    mark_written(gpu, &[&hist, &kb, &pb, &totals], &mut [&mut ka, &mut pa])?;
    Ok((ka, pa))
}
