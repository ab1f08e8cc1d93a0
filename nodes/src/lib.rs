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
//!
//! ## A job by hand
//!
//! Every rank builds the same graph (a source, the rolling node, a file
//! sink) and runs it. The sink writes a staged part; `commit`, once the
//! rank's graph has succeeded, moves every rank's part into place, so a
//! failed job leaves no output behind ([`job`] does the same with more
//! options, for the `rolling` binary):
//!
//! ```
//! use braid_core::{Graph, MemoryLimits, WorldSpec, channel, run_world};
//! use braid_nodes::rolling::{RollingSpec, rolling_node};
//! use braid_nodes::{Agg, Closed};
//! use braid_nodes::sink::{FileFormat, FileSink, SinkTarget};
//! use braid_nodes::source::{GeneratorSpec, Source};
//! use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
//!
//! let out = std::env::temp_dir().join(format!("braid-doc-job-{}", std::process::id()));
//! let data = GeneratorSpec {
//!     rows: 10_000, keys: 10, span: 100_000, seed: 1, null_fraction: 0.1, timestamp: false,
//! };
//! let spec = RollingSpec {
//!     order: "ts".into(),
//!     by: vec!["key".into()],
//!     values: vec!["v".into()],
//!     window: 1000.into(),
//!     closed: Closed::Right,
//!     aggs: vec![Agg::Sum, Agg::Count],
//! };
//! let schema = data.schema();
//! let sink = FileSink {
//!     format: FileFormat::Parquet,
//!     target: SinkTarget::Dir(out.clone()),
//!     schema: spec.output_schema(&schema)?,
//! };
//! sink.prepare()?;
//! // One job at a time writes an output: hold its lock until the commit is
//! // done (a job of processes takes it on rank 0, as `job` does).
//! let lock = sink.lock()?;
//! run_world(&WorldSpec::Local { nranks: 2 }, MemoryLimits::UNLIMITED, move |ctx| {
//!     let (data, spec, schema, sink) = (data.clone(), spec.clone(), schema.clone(), sink.clone());
//!     async move {
//!         // Taken before the graph runs: dropped uncommitted, it removes the part.
//!         let staged = sink.staged(ctx.rank());
//!         let (rows_tx, rows_rx) = channel(4);
//!         let (result_tx, result_rx) = channel(4);
//!         let mut g = Graph::new(ctx.clone());
//!         g.add("source", Source::Generator(data).run(ctx.clone(), 4096, rows_tx, None));
//!         g.add("rolling", rolling_node(ctx.clone(), spec, schema, 4096, rows_rx, result_tx));
//!         g.add("sink", sink.write(ctx.clone(), result_rx));
//!         g.run().await?;
//!         staged.commit(&ctx).await?;
//!         Ok(())
//!     }
//! })?;
//! drop(lock);
//! // One part per rank; every input row once, with its window's sum and count.
//! let mut rows = 0;
//! for part in std::fs::read_dir(&out)? {
//!     let file = std::fs::File::open(part?.path())?;
//!     for batch in ParquetRecordBatchReaderBuilder::try_new(file)?.build()? {
//!         let batch = batch?;
//!         assert!(batch.schema().column_with_name("v_count").is_some());
//!         rows += batch.num_rows();
//!     }
//! }
//! assert_eq!(rows, 10_000);
//! # std::fs::remove_dir_all(&out)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod csv_time;
mod csv_writer;
pub mod error;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod ipc;
pub mod job;
pub mod output_lock;
pub mod parquet_writer;
pub mod partition;
pub mod rolling;
pub mod shuffle;
pub mod sink;
pub mod sort;
pub mod source;
pub mod threads;
mod widen;

pub use error::DataError;
// The rolling window's terms (`rolling::RollingSpec`'s fields), from
// `braid-kernels`, so that a job needs no dependency of its own on it.
pub use braid_kernels::{Agg, CalendarUnit, Closed, Window, Zone};
