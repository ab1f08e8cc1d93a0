//! Stable LSD radix sort of u64 keys with a u32 payload permutation.
//!
//! Eight passes of 8 bits (histogram, scan, stable scatter; see
//! `kernels.cu`); a pass whose digit is the same for every key is skipped
//! (the histogram says so), which saves most passes for keys that share
//! their high bytes (timestamps). Memory: keys and permutation twice, plus
//! 256 counters per tile of 4096 keys.

use std::sync::Arc;

use braid_core::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use braid_core::cuda::{DeviceBuffer, Gpu};

use super::launch::{KernelError, Kernels, launched};
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
    let hist_f = k.func(rank, "radix_histogram")?;
    let scan_f = k.func(rank, "radix_scan")?;
    let scatter_f = k.func(rank, "radix_scatter")?;
    let nblocks = n.div_ceil(TILE) as u32;
    let hist_len = 256 * nblocks as u64;
    let hist = DeviceBuffer::alloc(gpu, hist_len as usize * 4)?;
    let (mut ka, mut pa) = (keys, perm);
    let mut kb = DeviceBuffer::alloc(gpu, n * 8)?;
    let mut pb = DeviceBuffer::alloc(gpu, n * 4)?;
    wait_inputs(gpu, &[&ka, &pa, &kb, &pb, &hist])?;
    let s = gpu.stream();
    let n64 = n as u64;
    let tiles = LaunchConfig {
        grid_dim: (nblocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let one = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut counts = vec![0u32; hist_len as usize];
    for pass in 0..8u32 {
        let shift = pass * 8;
        let (kp, hp) = (ka.ptr(), hist.ptr());
        let mut b = s.launch_builder(hist_f);
        b.arg(&kp).arg(&n64).arg(&shift).arg(&hp).arg(&nblocks);
        // SAFETY: live buffers of the checked sizes.
        launched(rank, unsafe { b.launch(tiles) })?;
        // Skip a pass whose digit is the same for every key.
        // SAFETY: `counts` has `hist_len` u32 and is synchronised below.
        unsafe {
            braid_core::cuda::cudarc::driver::result::memcpy_dtoh_async(
                &mut counts[..],
                hp,
                s.cu_stream(),
            )
        }
        .map_err(|e| {
            KernelError::Cuda(braid_core::cuda::CudaError::Driver {
                rank,
                call: "cuMemcpyDtoHAsync",
                detail: format!("{e:?}"),
            })
        })?;
        s.synchronize().map_err(|e| {
            KernelError::Cuda(braid_core::cuda::CudaError::Driver {
                rank,
                call: "cuStreamSynchronize",
                detail: format!("{e:?}"),
            })
        })?;
        let trivial = counts
            .chunks(nblocks as usize)
            .any(|digit| digit.iter().map(|&c| c as u64).sum::<u64>() == n64);
        if trivial {
            continue;
        }
        let mut b = s.launch_builder(scan_f);
        b.arg(&hp).arg(&hist_len);
        // SAFETY: as above.
        launched(rank, unsafe { b.launch(one) })?;
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
    mark_written(gpu, &[&hist, &kb, &pb], &mut [&mut ka, &mut pa])?;
    Ok((ka, pa))
}
