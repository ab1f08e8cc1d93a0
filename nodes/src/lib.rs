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
//! - [`threads`]: how a rank spreads its CPU-heavy steps over threads.

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
pub mod threads;

pub use error::DataError;
