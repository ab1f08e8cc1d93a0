//! How a rank spreads its CPU-heavy steps (Parquet decoding and encoding,
//! the local sort's radix sort and gather, the rolling kernel's chunks)
//! over threads.
//!
//! A rank's graph runs as tokio tasks; a step that is CPU work runs in
//! blocking tasks, and splits its work over up to [`rank_threads`] of
//! them: scoped threads ([`map_scoped`], from `braid_kernels::par`) or, for the Parquet source, that
//! many pieces decoded at once. The count is the host's cores shared among
//! the host's ranks, so ranks that fill the cores keep one thread each (as
//! before), while one or two ranks on a many-core host use the rest.
//!
//! The count is per step, not a budget a rank's steps share: steps that
//! overlap (the kernel's chunks while the sink encodes) may together run
//! about twice as many threads as the rank's share for a while, which costs
//! some time slicing but never blocks. The ranks on a host are counted as
//! `braid_core::Waiting` counts them (this process's contexts, or what the
//! launcher says); ranks started by hand on one host should set
//! `BRAID_HOST_RANKS` (or `BRAID_RANK_THREADS`), or each takes every core.

pub use braid_kernels::par::map_scoped;

/// The variable that sets [`rank_threads`] for a whole process.
pub const RANK_THREADS_ENV: &str = "BRAID_RANK_THREADS";

/// Threads a rank's CPU-heavy steps use: the host's cores shared among its
/// ranks ([`braid_core::context::cores_per_rank`]), or `BRAID_RANK_THREADS`
/// where set to a number of at least 1.
pub fn rank_threads() -> usize {
    // Read once (a bad value warns once); the cores' share may change as
    // ranks start, so it is asked each time.
    static SET: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    SET.get_or_init(|| braid_core::env::count(RANK_THREADS_ENV, 1))
        .unwrap_or_else(braid_core::context::cores_per_rank)
}
