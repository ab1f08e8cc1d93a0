//! braid-nodes: the pipeline nodes of braid jobs.
//!
//! - [`source`]: Parquet, CSV, in-memory and generated tables, split across
//!   ranks.
//! - [`sink`]: Parquet and CSV (a part per rank, or one file), in-memory.
//! - [`parquet_writer`]: Parquet files encoded on several threads, and
//!   concatenated without decoding.
//! - [`partition`]: hash and range partitioning of record batches.
//! - [`sort`]: distributed sample sort.
//! - [`shuffle`]: hash shuffle of tables.
//! - [`rolling`]: the rolling-window aggregation.
//! - [`ipc`]: packing batches to move them between ranks.
//! - [`job`]: the rolling-aggregation job as a graph.

pub mod error;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod ipc;
pub mod job;
pub mod parquet_writer;
pub mod partition;
pub mod rolling;
pub mod shuffle;
pub mod sink;
pub mod sort;
pub mod source;

pub use error::DataError;

/// The variable that sets [`io_threads`] for a whole process.
pub const IO_THREADS_ENV: &str = "BRAID_IO_THREADS";

/// Threads a rank's file source and sink decode and encode Parquet on: the
/// host's cores shared among its ranks
/// ([`braid_core::context::cores_per_rank`]), or `BRAID_IO_THREADS` where
/// set to a number of at least 1.
pub fn io_threads() -> usize {
    std::env::var(IO_THREADS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&t| t >= 1)
        .unwrap_or_else(braid_core::context::cores_per_rank)
}
