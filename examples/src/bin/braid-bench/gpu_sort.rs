//! GPU radix sort benchmark (feature `cuda`): sorts N random i64 keys with
//! their u32 permutation (the sort the GPU rolling job needs), timed on
//! the host from a synchronised stream to the sort's end (launches
//! included) after a warm-up, and prints ms per sort and keys/s. Its
//! baseline, `bench/torch_sort.py` (torch.sort, CUB underneath), is run
//! beside it by hand: this driver prints no ratio.

use std::time::Instant;

use braid_core::BoxError;
use braid_core::cuda::{DeviceBuffer, Gpu};
use braid_examples::outln;
use braid_kernels::gpu::{order_key_i64, radix_sort};

/// Options of `braid-bench gpu-sort`.
#[derive(Debug, clap::Args)]
pub struct GpuSortArgs {
    /// Number of keys (1 to 2^32 - 1: the permutation is u32).
    #[arg(long, default_value_t = 100_000_000, value_parser = clap::value_parser!(u32).range(1..))]
    n: u32,
    /// Timed repetitions (after one warm-up; at least 1).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
}

/// Runs the benchmark on device 0.
pub fn run(a: GpuSortArgs) -> Result<(), BoxError> {
    let gpu = Gpu::for_rank(0)?;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let keys: Vec<i64> = (0..a.n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as i64
        })
        .collect();
    let perm: Vec<u32> = (0..a.n).collect();
    let d_keys = DeviceBuffer::from_slice(&gpu, &keys)?;
    let d_perm = DeviceBuffer::from_slice(&gpu, &perm)?;
    let mut times = Vec::new();
    for rep in 0..=a.reps {
        let k = d_keys.try_clone()?;
        let p = d_perm.try_clone()?;
        gpu.stream().synchronize()?;
        let t = Instant::now();
        let ok = order_key_i64(&gpu, &k)?;
        let (sorted, _perm) = radix_sort(&gpu, ok, p)?;
        gpu.stream().synchronize()?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if rep > 0 {
            times.push(ms);
        }
        if rep == 0 {
            // Check once: ascending.
            let v: Vec<u64> = sorted.to_vec()?;
            if v.windows(2).any(|w| w[0] > w[1]) {
                return Err("radix sort output is not sorted".into());
            }
        }
    }
    times.sort_by(f64::total_cmp);
    let med = times[times.len() / 2];
    outln!(
        "braid radix sort: {} i64 keys + u32 permutation on {}: median {:.2} ms ({:.2} Gkeys/s), runs {:?}",
        a.n,
        gpu.context().name().unwrap_or_default(),
        med,
        a.n as f64 / med / 1e6,
        times.iter().map(|t| format!("{t:.2}")).collect::<Vec<_>>()
    );
    Ok(())
}
