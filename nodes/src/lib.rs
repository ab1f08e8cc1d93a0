//! braid-nodes: the pipeline nodes of braid jobs.
//!
//! - [`source`]: Parquet, CSV, in-memory and generated tables, split across
//!   ranks.
//! - [`sink`]: Parquet and CSV (a part per rank, or one file), in-memory.
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
pub mod partition;
pub mod rolling;
pub mod shuffle;
pub mod sink;
pub mod sort;
pub mod source;

pub use error::DataError;
