//! GPU kernels (feature `cuda`): CUDA C compiled at run time with NVRTC,
//! once per process and device, and launched on a caller's stream.
//!
//! [`Kernels::get`] compiles `kernels.cu` for the device's architecture on
//! first use and caches the module; every launch wrapper checks lengths
//! before enqueuing anything and orders its work after the inputs' latest
//! writes (see `braid_core::cuda::DeviceBuffer`).
//!
//! | kernel | what | cost |
//! |---|---|---|
//! | [`gather`] | `out[i] = in[idx[i]]`, 1/4/8-byte elements | one read of idx, one gather, one write |
//! | [`hash_partition`] | partition id per i64 key and counts per partition | one read, atomics on N counters |
//! | [`radix_sort`] | stable LSD radix sort of u64 keys with a u32 permutation | 8 passes over keys + permutation |

mod launch;
mod ops;
mod sort;

pub use launch::{KernelError, Kernels};
pub use ops::{gather, hash_partition, order_key_f64, order_key_i64};
pub use sort::radix_sort;
