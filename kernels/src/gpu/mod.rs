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
//! | [`gather`] | `out[i] = in[idx[i]]`, 1/2/4/8-byte elements | one read of idx, one gather, one write |
//! | [`hash_partition`] | partition id per i64 key and counts per partition | one read, atomics on N counters |
//! | [`radix_sort`] | stable LSD radix sort of u64 keys with a u32 permutation | per needed byte: keys read twice, keys + permutation written once |
//! | [`lower_bound`] | first index >= each query in sorted u64 | a binary search per query |
//! | [`cast_to_f64`], [`cast_to_i64`] | numeric columns to f64 / integer columns to i64 | one read, one write |
//! | [`NvlinkSendRecv`] | SendRecv by SMs through staging slots in the peer's memory | NVLink writes + a local copy per chunk |
//! | [`rolling`] | time-window sum/mean/min/max/count/std/var over sorted rows, grouped or not | O(log w) search + O(32 log_32 w) merges per row |

mod cast;
mod launch;
mod nvlink;
mod ops;
mod rolling;
mod sort;

pub use cast::{NumType, cast_to_f64, cast_to_i64};
pub use launch::{Build, KernelError, Kernels, SOURCE_VAR};
pub use nvlink::{NvlinkConfig, NvlinkSendRecv, Staging};
pub use ops::{gather, hash_partition, iota, iota_i64, lower_bound, order_key_f64, order_key_i64};
pub use rolling::{GpuAggColumn, RollingInput, check_window, rolling};
pub use sort::radix_sort;
