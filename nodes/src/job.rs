//! The rolling-aggregation job as a graph of nodes on each rank:
//!
//! ```text
//!   agree on the job (AllGather of its terms: every rank the same job)
//!   source ──chunks──> rolling (sort or shuffle, halo, kernel) ──chunks──> sink
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use braid_coll::allgather_parts;
use braid_core::{Context, Graph, NodeError, Receiver, Sender, channel};

use crate::error::DataError;
use crate::rolling::{RollingSpec, rolling_node};
use crate::sink::{CollectSink, FileSink, SinkTarget};
use crate::source::Source;

/// Where the job's output goes.
#[derive(Debug, Clone)]
pub enum Output {
    /// Files.
    File(FileSink),
    /// Memory (tests).
    Collect(CollectSink),
    /// Nowhere (benchmarks of the computation alone).
    Discard,
}

/// Where the job computes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Device {
    /// On the host (Arrow kernels).
    #[default]
    Cpu,
    /// On one GPU per rank (feature `cuda`): device chunks, NVRTC kernels,
    /// NCCL collectives.
    Gpu,
}

/// The rolling-aggregation job of one rank.
#[derive(Debug, Clone)]
pub struct RollingJob {
    /// Input.
    pub source: Source,
    /// What to compute.
    pub spec: RollingSpec,
    /// Output.
    pub output: Output,
    /// Rows per chunk.
    pub chunk_rows: usize,
    /// Where the rolling node computes.
    pub device: Device,
}

/// Forwards `input` to `output` (if any), adding up the rows in `counter`.
async fn count_rows(
    mut input: Receiver,
    mut output: Option<Sender>,
    counter: Arc<AtomicU64>,
) -> Result<(), NodeError> {
    while let Some(m) = input.recv().await {
        if let Some(rows) = m.payload.num_rows() {
            counter.fetch_add(rows as u64, Ordering::Relaxed);
        }
        if let Some(o) = &mut output {
            o.send(m).await?;
        }
    }
    Ok(())
}

/// A running job's row counts, for progress displays: each rank of this
/// process that runs the job with it registers its live counters (rows
/// read by its source, rows that reached its sink), and a display sums
/// them.
#[derive(Debug, Default)]
pub struct JobProgress {
    ranks: Mutex<Vec<(Arc<AtomicU64>, Arc<AtomicU64>)>>,
}

impl JobProgress {
    /// No ranks yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn register(&self, read: Arc<AtomicU64>, written: Arc<AtomicU64>) {
        if let Ok(mut r) = self.ranks.lock() {
            r.push((read, written));
        }
    }

    fn sum(&self, pick: impl Fn(&(Arc<AtomicU64>, Arc<AtomicU64>)) -> &AtomicU64) -> u64 {
        self.ranks.lock().map_or(0, |r| {
            r.iter().map(|c| pick(c).load(Ordering::Relaxed)).sum()
        })
    }

    /// Rows read so far, over this process's ranks.
    pub fn read(&self) -> u64 {
        self.sum(|c| &c.0)
    }

    /// Rows computed and passed to the output so far, over this process's
    /// ranks.
    pub fn written(&self) -> u64 {
        self.sum(|c| &c.1)
    }
}

/// Row counts of one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobCounts {
    /// Rows this rank read.
    pub rows_in: u64,
    /// Rows this rank wrote.
    pub rows_out: u64,
}

/// The largest chunk a job takes: readers allocate a chunk's rows up
/// front, so a huge one would only fail in the allocator.
pub const MAX_CHUNK_ROWS: usize = 1 << 26;

impl RollingJob {
    /// Checks the job on this rank before any work: the input's schema, the
    /// spec against it, the output's writability.
    pub fn check(&self) -> Result<(), DataError> {
        if self.chunk_rows == 0 || self.chunk_rows > MAX_CHUNK_ROWS {
            return Err(DataError::Invalid(format!(
                "chunk rows must be 1 to {MAX_CHUNK_ROWS}, got {}",
                self.chunk_rows
            )));
        }
        let schema = self.source.schema()?;
        self.spec
            .output_schema(&schema)
            .map_err(|e| self.source.explain(e))?;
        if self.device == Device::Gpu {
            #[cfg(feature = "cuda")]
            crate::gpu::check_gpu_spec(&self.spec, &schema, crate::gpu::Columns::Needed)?;
            #[cfg(not(feature = "cuda"))]
            return Err(DataError::Invalid(
                "--device gpu needs a build with the `cuda` feature".into(),
            ));
        }
        if let Output::File(f) = &self.output {
            f.prepare()?;
        }
        Ok(())
    }

    /// What every rank of the job must be given alike, as (name, value)
    /// pairs: the spec, where the input comes from, where the output goes
    /// and the device. (Not the chunk size: it changes no result.)
    pub fn terms(&self) -> Vec<(&'static str, String)> {
        let s = &self.spec;
        let list = |v: &[String]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(",")
            }
        };
        // Paths as absolute ones: ranks in other working directories
        // (mpirun's MPMD form with `-wdir`) given one relative path name
        // different files, and wrote one output's parts to two places.
        let abs = |p: &std::path::Path| {
            std::path::absolute(p)
                .unwrap_or_else(|_| p.to_path_buf())
                .display()
                .to_string()
        };
        let input = match &self.source {
            Source::Parquet(p) => format!("Parquet at {}", abs(p)),
            Source::Csv(p) => format!("CSV at {}", abs(p)),
            Source::Memory(..) => "batches in memory".to_string(),
            Source::Generator(g) => format!(
                "generated ({} rows, {} keys, span {}, seed {}, null fraction {}, {})",
                g.rows,
                g.keys,
                g.span,
                g.seed,
                g.null_fraction,
                if g.timestamp {
                    "timestamps"
                } else {
                    "integer ts"
                }
            ),
        };
        let output = match &self.output {
            Output::File(f) => match &f.target {
                SinkTarget::Dir(p) => format!("the directory {} ({:?})", abs(p), f.format),
                SinkTarget::File(p) => format!("the file {}", abs(p)),
            },
            Output::Collect(_) => "memory".to_string(),
            Output::Discard => "none".to_string(),
        };
        let aggs: Vec<String> = s.aggs.iter().map(ToString::to_string).collect();
        vec![
            ("input", input),
            ("order column", s.order.clone()),
            ("group columns", list(&s.by)),
            ("value columns", list(&s.values)),
            ("window", format!("{:?}", s.window)),
            ("closed", s.closed.to_string()),
            ("aggregations", aggs.join(",")),
            ("output", output),
            ("device", format!("{:?}", self.device)),
        ]
    }

    /// Fails on every rank, with one message, where the ranks were given
    /// different jobs ([`Self::terms`]): one AllGather of a few hundred
    /// bytes before any work. Without it, ranks told different windows
    /// would write inconsistent results without a word, and a rank told
    /// to write an output that another was not would wait for ever in a
    /// commit the other never joins.
    ///
    /// `refused`: why this rank cannot run the job (rank 0 could not take
    /// the output): every rank then fails with it.
    pub async fn agree(&self, ctx: &Context, refused: Option<String>) -> Result<(), NodeError> {
        // A refusal first, then the values only, each ended by a NUL (the
        // names are the same on every rank; no path or column name holds
        // a NUL, and a refusal's NULs become spaces).
        let terms = self.terms();
        let mut mine = refused.unwrap_or_default().replace('\0', " ").into_bytes();
        mine.push(0);
        for (_, value) in &terms {
            mine.extend_from_slice(value.as_bytes());
            mine.push(0);
        }
        let all = allgather_parts::<u8>(ctx, mine)
            .await
            .map_err(NodeError::other)?;
        let split = |p: &[u8]| -> (String, Vec<u8>) {
            let at = p.iter().position(|c| *c == 0).unwrap_or(p.len());
            (
                String::from_utf8_lossy(&p[..at]).into_owned(),
                p.get(at + 1..).unwrap_or_default().to_vec(),
            )
        };
        let all: Vec<(String, Vec<u8>)> = all.iter().map(|p| split(&p.as_slice())).collect();
        if let Some((r, (why, _))) = all.iter().enumerate().find(|(_, (w, _))| !w.is_empty()) {
            return Err(if r == ctx.rank() as usize {
                NodeError::other(DataError::Invalid(why.clone()))
            } else {
                NodeError::other(braid_core::world::PeerFailure {
                    peer: r as u32,
                    detail: format!("rank {r} cannot run the job: {why}"),
                })
            });
        }
        let all: Vec<&[u8]> = all.iter().map(|(_, t)| t.as_slice()).collect();
        let Some((first, rest)) = all.split_first() else {
            return Ok(());
        };
        let Some((r, other)) = rest.iter().enumerate().find(|(_, p)| *p != first) else {
            return Ok(());
        };
        // The first term whose value differs.
        let fields = |b: &[u8]| -> Vec<String> {
            b.split(|c| *c == 0)
                .map(|f| String::from_utf8_lossy(f).into_owned())
                .collect()
        };
        let (f0, f1) = (fields(first), fields(other));
        let at = |f: &[String], i: usize| f.get(i).cloned().unwrap_or_else(|| "?".into());
        let (name, a, b) = (0..terms.len())
            .map(|i| (terms[i].0, at(&f0, i), at(&f1, i)))
            .find(|(_, a, b)| a != b)
            .unwrap_or(("job", "?".into(), "?".into()));
        Err(NodeError::other(DataError::Invalid(format!(
            "the ranks were given different jobs ({name}: {a} on rank 0, {b} on rank {}); every rank must be started with the same arguments",
            r + 1
        ))))
    }

    /// Runs the job on this rank, once every rank agrees on it
    /// ([`Self::agree`]). `progress`, where given, sees this rank's rows
    /// read and written as they go.
    pub async fn run(
        self,
        ctx: Context,
        progress: Option<Arc<JobProgress>>,
    ) -> Result<JobCounts, NodeError> {
        // Rank 0 takes the output before any rank stages a byte; where it
        // cannot (a second job writing it), every rank fails at the
        // agreement with rank 0's error.
        let lock = match &self.output {
            Output::File(f) if ctx.rank() == 0 => Some(f.lock()),
            _ => None,
        };
        let refused = match &lock {
            Some(Err(e)) => Some(e.to_string()),
            _ => None,
        };
        self.agree(&ctx, refused).await?;
        let _lock = lock.transpose()?;
        let schema = self.source.schema()?;
        let out_schema = self.spec.output_schema(&schema)?;
        let (src_tx, src_rx) = channel(4);
        let (out_tx, out_rx) = channel(4);
        let rows_in = Arc::new(AtomicU64::new(0));
        let rows_out = Arc::new(AtomicU64::new(0));
        if let Some(p) = &progress {
            p.register(rows_in.clone(), rows_out.clone());
        }
        let mut g = Graph::new(ctx.clone());
        {
            let (ctx, ri) = (ctx.clone(), rows_in.clone());
            let source = self.source.clone();
            let chunk = self.chunk_rows;
            g.add("source", source.run(ctx, chunk, src_tx, Some(ri)));
        }
        match self.device {
            Device::Cpu => {
                g.add(
                    "rolling",
                    rolling_node(
                        ctx.clone(),
                        self.spec.clone(),
                        schema.clone(),
                        self.chunk_rows,
                        src_rx,
                        out_tx,
                    ),
                );
            }
            #[cfg(feature = "cuda")]
            Device::Gpu => {
                // The GPU starts up inside the node, while the source reads;
                // the node sends host chunks (its input's, with the
                // aggregates added).
                g.add(
                    "gpu_rolling",
                    crate::gpu::gpu_rolling_job_node(
                        ctx.clone(),
                        self.spec.clone(),
                        schema.clone(),
                        src_rx,
                        out_tx,
                    ),
                );
            }
            #[cfg(not(feature = "cuda"))]
            Device::Gpu => {
                drop((src_rx, out_tx));
                return Err(NodeError::other(
                    "--device gpu needs a build with the `cuda` feature",
                ));
            }
        }
        // Counts the output rows on their way to the sink.
        let (count_tx, count_rx) = channel(4);
        let downstream = match &self.output {
            Output::Discard => None,
            _ => Some(count_tx),
        };
        g.add("count", count_rows(out_rx, downstream, rows_out.clone()));
        let mut staged = None;
        match self.output {
            Output::File(mut f) => {
                f.schema = out_schema;
                staged = Some(f.staged(ctx.rank()));
                g.add("sink", f.write(ctx.clone(), count_rx));
            }
            Output::Collect(c) => {
                g.add("sink", c.run(count_rx));
            }
            Output::Discard => {}
        }
        g.run().await.map_err(|e| NodeError::Other(Box::new(e)))?;
        if let Some(s) = staged {
            s.commit(&ctx).await?;
        }
        Ok(JobCounts {
            rows_in: rows_in.load(Ordering::Relaxed),
            rows_out: rows_out.load(Ordering::Relaxed),
        })
    }
}
