//! Sinks: nodes that take a stream of chunks and store it.
//!
//! Files are first written to a staging area and only moved into place
//! once every rank has written its part, so a failed job never leaves
//! output that looks complete:
//!
//! ```text
//!   every rank: write STAGING/part-RRRRR.<ext>      (the sink node)
//!   the rank's whole graph succeeded                 (Staged::commit)
//!   barrier (all ranks wrote their part; a failure aborts the job here)
//!   directory output:
//!     each rank: DIR/part-RRRRR.<ext>, if any, gets a second name
//!                DIR/.part-RRRRR.<ext>.braid-replaced; its staged part
//!                replaces it (rename)
//!     rank 0:    the earlier run's other parts -> .NAME.braid-replaced
//!     agree: the lowest rank whose moves failed, if any (then each rank
//!            undoes its own moves)
//!     each rank drops its second names; rank 0 any left by a killed run
//!   single file:
//!     rank 0: appends the parts in rank order into STAGING/joined.<ext>
//!     agree: the join succeeded
//!     rank 0: FILE, if any, gets a second name FILE.braid-replaced;
//!             joined replaces FILE
//!     agree: the file is in place (else rank 0 undoes it)
//!   rank 0 drops its second names and removes STAGING
//! ```
//!
//! Each agreement is an AllReduce of one number: a rank whose step
//! failed, or one that died or aborted meanwhile, fails every rank's
//! commit, and each rank then undoes what it moved (its `Staged`, dropped
//! uncommitted, renames the second names back), so a failed or stopped
//! job leaves the output as it was. A file's second name is a hard link
//! (a rename where the file system has none), so the output's names
//! always name whole files, also for a process killed between two steps.
//! A stop signal that comes while a commit moves files should let it
//! finish ([`placing_outputs`]): the moves take milliseconds, and a rank
//! stopped between its agreement and its end, while the others keep their
//! parts, would leave a directory output mixed. The same holds for a rank
//! killed there (SIGKILL), which no protocol of renames can rule out. A
//! join running on a blocking thread is told to stop when its commit is
//! abandoned; it never moves anything into place.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_schema::{DataType, Field, FieldRef, Schema, SchemaRef, TimeUnit};
use braid_coll::{ReduceKind, allreduce, barrier};
use braid_core::{Context, NodeError, Payload, Receiver};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

use crate::csv_writer::CsvWriter;
use crate::error::{DataError, Result};
use crate::output_lock::{OutputLock, beside, make_dirs, missing_dirs, remove_made};
use crate::parquet_writer::{ColumnParallelWriter, concat_parquet};
use crate::partition::check_columns;

/// File format of a sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// Parquet (snappy).
    Parquet,
    /// CSV with a header.
    Csv,
}

impl FileFormat {
    fn ext(self) -> &'static str {
        match self {
            FileFormat::Parquet => "parquet",
            FileFormat::Csv => "csv",
        }
    }
}

/// Whether `name` is a part a sink writes (`part-<digits>.parquet` or
/// `.csv`): what a run into the same directory replaces. Other files,
/// `part-notes.csv` included, are the user's and stay.
fn is_part_file(name: &str) -> bool {
    let Some((stem, ext)) = name.strip_prefix("part-").and_then(|r| r.split_once('.')) else {
        return false;
    };
    !stem.is_empty()
        && stem.bytes().all(|b| b.is_ascii_digit())
        && [FileFormat::Parquet, FileFormat::Csv]
            .iter()
            .any(|f| f.ext() == ext)
}

/// Whether `path` as written ends in a path separator (`out.csv/`), which
/// says a directory is meant.
pub fn ends_in_separator(path: &Path) -> bool {
    path.as_os_str()
        .as_encoded_bytes()
        .last()
        .is_some_and(|&b| std::path::is_separator(b as char))
}

/// Where a sink writes.
#[derive(Debug, Clone)]
pub enum SinkTarget {
    /// One part file per rank in this directory.
    Dir(PathBuf),
    /// One file.
    File(PathBuf),
}

impl SinkTarget {
    /// A file when the path ends in `.<ext>` of the format (any case), else
    /// a directory; a path that ends in `/` is a directory whatever its
    /// name (`out.csv/`: a directory of CSV parts).
    pub fn from_path(path: PathBuf, format: FileFormat) -> Self {
        if crate::source::has_extension(&path, format.ext()) && !ends_in_separator(&path) {
            SinkTarget::File(path)
        } else {
            SinkTarget::Dir(path)
        }
    }

    /// The directory or file asked for.
    pub fn path(&self) -> &Path {
        match self {
            SinkTarget::Dir(p) | SinkTarget::File(p) => p,
        }
    }

    fn staging(&self) -> PathBuf {
        match self {
            SinkTarget::Dir(d) => d.join(".braid-staging"),
            SinkTarget::File(f) => beside(f, "", ".braid-staging"),
        }
    }

    /// The lock file of the output ([`FileSink::lock`]): in a directory
    /// output (hidden, as its staging area), beside a one-file output.
    fn lock_path(&self) -> PathBuf {
        match self {
            SinkTarget::Dir(d) => d.join(".braid-lock"),
            SinkTarget::File(f) => beside(f, "", ".braid-lock"),
        }
    }
}

/// A file sink.
#[derive(Debug, Clone)]
pub struct FileSink {
    /// Format.
    pub format: FileFormat,
    /// Destination.
    pub target: SinkTarget,
    /// Schema of the stream: the columns of every chunk (names and types,
    /// in order; the sink fails on a chunk whose columns differ rather
    /// than write them under the wrong names or types), and of a rank's
    /// empty part.
    pub schema: SchemaRef,
}

enum Writer {
    Parquet(Box<ColumnParallelWriter>),
    Csv(Box<CsvWriter<File>>),
}

/// The schema a Parquet part is written in. Parquet has no timestamp
/// unit of seconds and no 64-bit date: such columns would be stored as bare
/// INT64s that other readers (pyarrow, DuckDB) take for plain integers, so
/// second timestamps are written in milliseconds and `date64` as `date32`
/// (Parquet's DATE), as pyarrow does; every other column as it is.
fn parquet_schema(schema: &SchemaRef) -> SchemaRef {
    if !schema
        .fields()
        .iter()
        .any(|f| parquet_type(f.data_type()).is_some())
    {
        return schema.clone();
    }
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match parquet_type(f.data_type()) {
            Some(t) => f.as_ref().clone().with_data_type(t),
            None => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// The type a column of type `t` is written to Parquet as, where Parquet
/// has no type of its own for `t` or for a type inside it (a struct's
/// field, a list's or a map's entries, a dictionary's values).
fn parquet_type(t: &DataType) -> Option<DataType> {
    let field = |f: &FieldRef| -> Option<FieldRef> {
        parquet_type(f.data_type()).map(|t| Arc::new(f.as_ref().clone().with_data_type(t)))
    };
    match t {
        DataType::Timestamp(TimeUnit::Second, tz) => {
            Some(DataType::Timestamp(TimeUnit::Millisecond, tz.clone()))
        }
        DataType::Date64 => Some(DataType::Date32),
        DataType::Dictionary(k, v) => {
            parquet_type(v).map(|v| DataType::Dictionary(k.clone(), Box::new(v)))
        }
        DataType::List(f) => field(f).map(DataType::List),
        DataType::LargeList(f) => field(f).map(DataType::LargeList),
        DataType::FixedSizeList(f, n) => field(f).map(|f| DataType::FixedSizeList(f, *n)),
        DataType::Map(f, sorted) => field(f).map(|f| DataType::Map(f, *sorted)),
        DataType::Struct(fields) => {
            if !fields.iter().any(|f| parquet_type(f.data_type()).is_some()) {
                return None;
            }
            Some(DataType::Struct(
                fields
                    .iter()
                    .map(|f| field(f).unwrap_or_else(|| f.clone()))
                    .collect(),
            ))
        }
        _ => None,
    }
}

/// How Parquet parts of `schema` (and the file they are joined into) are
/// written: snappy, as DuckDB, Spark and pyarrow write by default; row
/// groups of at most [`ROW_GROUP_BYTES`] (estimated, encoded) as well as
/// 1M rows; float columns' dictionaries given up at
/// [`FLOAT_DICTIONARY_BYTES`].
fn parquet_props(schema: &SchemaRef) -> WriterProperties {
    let floats = schema.fields().iter().filter(|f| {
        matches!(
            f.data_type(),
            DataType::Float16 | DataType::Float32 | DataType::Float64
        )
    });
    floats
        .fold(WriterProperties::builder(), |b, f| {
            b.set_column_dictionary_page_size_limit(
                ColumnPath::from(f.name().as_str()),
                FLOAT_DICTIONARY_BYTES,
            )
        })
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
        .build()
}

/// `b` in slices (no copies) of about a sixteenth of [`ROW_GROUP_BYTES`]
/// each in memory: the writer cuts a row group by its bytes at the rows
/// it has seen, so a chunk of large rows (3,000 strings of 50 KB) given
/// whole made one 143 MiB row group.
fn row_group_pieces(b: &RecordBatch) -> Vec<RecordBatch> {
    // The bytes of the rows themselves: a chunk's input columns are
    // slices of the whole sorted partition, which the buffers' sizes
    // would count.
    let bytes: usize = b
        .columns()
        .iter()
        .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0))
        .sum();
    let rows = b.num_rows();
    let per = (rows as u128 * (ROW_GROUP_BYTES / 16) as u128 / bytes.max(1) as u128)
        .clamp(1, rows.max(1) as u128) as usize;
    (0..rows)
        .step_by(per)
        .map(|at| b.slice(at, per.min(rows - at)))
        .collect()
}

/// The dictionary size at which a float column's chunk falls back to
/// plain encoding: 64 KiB (8K distinct doubles), not the default 1 MiB.
///
/// The writer tries a dictionary for every column of every row group and
/// gives it up only once it is past its limit. Aggregates (and most
/// measured floats) are nearly all distinct, so each row group paid for
/// hashing 128K values a float column before falling back: with 147
/// aggregate columns that was most of the job's time (1M rows, 1 rank:
/// 7.1 s with row groups cut at 64 MiB, 3.1 s with no dictionaries). Floats
/// of few distinct values (prices in cents) still get their dictionary.
const FLOAT_DICTIONARY_BYTES: usize = 64 << 10;

/// A Parquet row group's largest estimated encoded size: 64 MiB. A rank's
/// writer holds its open row group, encoded, until it is cut; by rows
/// alone (1M) a wide output (173 Float64 columns) held ~1 GiB a rank, and
/// a 4-rank job 3.9 GiB for 1M rows. 64 MiB keeps narrow tables' groups
/// near 1M rows (10 numeric columns) and wide ones near 50K.
const ROW_GROUP_BYTES: usize = 64 << 20;

/// `batch` in `schema` (from [`parquet_schema`]): second timestamps cast
/// to milliseconds (exact: every second is a whole number of ms), dates
/// to days (exact for dates at midnight, which Arrow asks `date64` to
/// hold).
fn to_parquet_batch(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.schema().fields() == schema.fields() {
        return Ok(batch);
    }
    let cols = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c.clone())
            } else {
                arrow_cast::cast(c, f.data_type())
            }
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}

impl FileSink {
    /// Checks, before any work, that the destination can be written: makes
    /// the staging directory. Call on every rank.
    pub fn prepare(&self) -> Result<()> {
        if let SinkTarget::Dir(d) = &self.target {
            // (Without a trailing `/`, with which an existing file's stat
            // fails as "not a directory".)
            let bare: std::path::PathBuf = d.components().collect();
            if bare.exists() && !bare.is_dir() {
                return Err(DataError::file(
                    d,
                    "the output directory is an existing file (a one-file output is named *.parquet or *.csv)",
                ));
            }
        }
        // Checked before the staging directory is made: a refused output
        // leaves nothing behind.
        if let SinkTarget::File(f) = &self.target {
            if f.is_dir() {
                return Err(DataError::file(f, "output file is a directory"));
            }
        }
        if self.format == FileFormat::Csv {
            if let Some(e) = crate::csv_writer::unwritable(&self.schema) {
                return Err(DataError::file(self.target.path(), e));
            }
        }
        // Writability without making the staging directory: a probe
        // directory of this process's own name is made and removed in the
        // nearest directory that exists (the staging directory's, or the
        // one it will be made in). A staging directory made here would be
        // left behind by a rank ended before its job starts (mpirun ends
        // the other ranks when one fails its own checks); one made and
        // removed again raced with the other ranks' checks of the same
        // path ("the output directory is an existing file" where another
        // rank had just removed it). The sink makes the directories when
        // it writes.
        let staging = self.target.staging();
        let base = staging
            .ancestors()
            .skip(1)
            .find(|a| a.as_os_str().is_empty() || a.exists())
            .map(|a| {
                if a.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    a
                }
            })
            .unwrap_or(Path::new("."));
        static PROBES: AtomicUsize = AtomicUsize::new(0);
        let probe = base.join(format!(
            ".braid-probe-{}-{}",
            std::process::id(),
            PROBES.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&probe).map_err(|e| {
            DataError::file(
                self.target.path(),
                format!("output is not writable: {}: {e}", base.display()),
            )
        })?;
        let _ = std::fs::remove_dir(&probe);
        Ok(())
    }

    fn part(&self, rank: u32) -> PathBuf {
        self.target
            .staging()
            .join(format!("part-{rank:05}.{}", self.format.ext()))
    }

    fn open(&self, path: &Path) -> Result<Writer> {
        // The staging directory is gone where another rank failed first
        // and cleaned up: made again (this rank's guard removes it once
        // empty), so that this rank fails with its own error or the
        // job's abort, not with a missing directory that hides both.
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| DataError::file(dir, e))?;
        }
        let f = File::create(path).map_err(|e| DataError::file(path, e))?;
        Ok(match self.format {
            // Both boxed: a writer moves into a blocking task per chunk.
            FileFormat::Parquet => Writer::Parquet(Box::new(
                ColumnParallelWriter::try_new(
                    f,
                    parquet_schema(&self.schema),
                    parquet_props(&self.schema),
                    crate::threads::rank_threads(),
                )
                .map_err(|e| DataError::file(path, e))?,
            )),
            FileFormat::Csv => {
                // The header goes out now, so that a part with no rows is
                // still a CSV file of this schema.
                let w = CsvWriter::new(f, &self.schema).map_err(|e| DataError::file(path, e))?;
                Writer::Csv(Box::new(w))
            }
        })
    }

    /// This rank's staged part, to commit once the whole graph has
    /// succeeded ([`Staged::commit`]); dropped uncommitted (a failure, a
    /// cancelled job), it removes the part and the staging directory (on
    /// rank 0; on the others once it is empty). Take it before the graph
    /// runs, so that nothing a failed or cancelled job staged is left
    /// behind.
    pub fn staged(&self, rank: u32) -> Staged {
        live_staged().push(self.target.staging());
        // What the job will make above the staging area (the output
        // directory, its missing parents): removed again where still
        // empty when an uncommitted part is dropped.
        let made = self
            .target
            .staging()
            .parent()
            .map(missing_dirs)
            .unwrap_or_default();
        Staged {
            made,
            sink: self.clone(),
            part: self.part(rank),
            staging: self.target.staging(),
            cleanup: if rank == 0 {
                Cleanup::Whole
            } else {
                Cleanup::IfEmpty
            },
            armed: true,
            moved: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The sink node: writes every chunk of `input` into this rank's staged
    /// part. The commit is separate ([`Staged::commit`]): a node cannot tell
    /// a stream that ended from one whose producer failed, so only the
    /// graph's outcome may move output into place.
    pub async fn write(self, ctx: Context, mut input: Receiver) -> Result<(), NodeError> {
        let part = self.part(ctx.rank());
        self.write_part(&mut input, &part).await
    }

    /// Takes the output for this job (call on rank 0, before the ranks
    /// agree on the job, so that no rank stages anything without it):
    /// fails where another job holds it, and removes what a killed
    /// earlier job left staged. Hold the lock until the commit is done.
    ///
    /// The directories it makes for the output (where they were missing)
    /// are removed again when the lock is dropped, if still empty: a
    /// failed job leaves no empty output directory behind.
    pub fn lock(&self) -> Result<OutputLock> {
        let path = self.target.lock_path();
        let mut made = Vec::new();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            made = make_dirs(dir).map_err(|e| DataError::file(dir, e))?;
        }
        let lock = match OutputLock::acquire(path, self.target.path()) {
            Ok(l) => l.with_made(made),
            Err(e) => {
                remove_made(&made);
                return Err(e);
            }
        };
        if lock.held() {
            // No job stages here but this one now: a staging area (or a
            // file of its name) is a killed job's.
            let staging = self.target.staging();
            match std::fs::symlink_metadata(&staging) {
                Ok(m) if m.is_dir() => {
                    let _ = std::fs::remove_dir_all(&staging);
                }
                Ok(_) => {
                    let _ = std::fs::remove_file(&staging);
                }
                Err(_) => {}
            }
        }
        Ok(lock)
    }

    /// Removes the staging area after a failure outside the graph (an MPI
    /// abort ends the process without running the `Staged` guard): only
    /// while this process has a [`Staged`] of it, since otherwise the area
    /// may be another job's (one whose lock made this job fail).
    pub fn abandon(&self) {
        let staging = self.target.staging();
        if live_staged().contains(&staging) {
            let _ = std::fs::remove_dir_all(staging);
        }
    }

    /// Whether `b` has the sink's columns (names and types, in order;
    /// nullability may differ): a Parquet part casts each column to its
    /// field's type by position, and a CSV part's header comes from the
    /// schema, so any other chunk would be written wrong without a word.
    fn check_columns(&self, b: &RecordBatch) -> Result<()> {
        check_columns("file sink", &self.schema, b)
    }

    async fn write_part(&self, input: &mut Receiver, part: &Path) -> Result<(), NodeError> {
        let mut w = self.open(part)?;
        let pq = parquet_schema(&self.schema);
        while let Some(m) = input.recv().await {
            let Payload::Table(t) = m.payload else {
                return Err(NodeError::other("file sink got a non-table message"));
            };
            let b = t.into_batch();
            self.check_columns(&b)?;
            let pq = pq.clone();
            // Encoding is CPU work: keep it off the runtime's threads.
            w = tokio::task::spawn_blocking(move || -> Result<Writer> {
                match &mut w {
                    Writer::Parquet(pw) => {
                        for piece in row_group_pieces(&to_parquet_batch(b, &pq)?) {
                            pw.write(&piece)?;
                        }
                    }
                    Writer::Csv(cw) => cw.write(&b)?,
                }
                Ok(w)
            })
            .await
            .map_err(NodeError::other)??;
        }
        match w {
            Writer::Parquet(pw) => {
                pw.close().map_err(|e| DataError::file(part, e))?;
            }
            Writer::Csv(cw) => cw.finish().map_err(|e| DataError::file(part, e))?,
        }
        Ok(())
    }

    /// Joins `parts` in rank order into `joined` (rank 0 of a one-file
    /// output); `stop` ends it early (an abandoned commit). Nothing is
    /// moved into place here.
    fn join(&self, parts: &[PathBuf], joined: &Path, stop: &AtomicBool) -> Result<()> {
        let stopped = || DataError::file(joined, "stopped: the job was abandoned");
        match self.format {
            FileFormat::Parquet => {
                // The parts' encoded row groups are copied, not decoded
                // and encoded again.
                let out = File::create(joined).map_err(|e| DataError::file(joined, e))?;
                concat_parquet(
                    parts,
                    out,
                    parquet_schema(&self.schema),
                    parquet_props(&self.schema),
                    stop,
                )
                .map_err(|e| DataError::file(joined, e))?;
            }
            FileFormat::Csv => {
                use std::io::{Read, Write};
                let mut out = std::io::BufWriter::new(
                    File::create(joined).map_err(|e| DataError::file(joined, e))?,
                );
                // Every part starts with the same header: the first part
                // is copied whole, the others past their header's bytes
                // (a quoted column name may hold a line break, so the
                // header is not "the first line"), byte for byte.
                let header = crate::csv_writer::header(&self.schema)
                    .map_err(|e| DataError::file(joined, e))?;
                let mut buf = vec![0u8; 1 << 20];
                for (i, p) in parts.iter().enumerate() {
                    let mut f = File::open(p).map_err(|e| DataError::file(p, e))?;
                    if i > 0 {
                        let mut head = vec![0u8; header.len()];
                        f.read_exact(&mut head).map_err(|e| DataError::file(p, e))?;
                        if head != header {
                            return Err(DataError::file(p, "its header differs from the output's"));
                        }
                    }
                    loop {
                        if stop.load(Ordering::Relaxed) {
                            return Err(stopped());
                        }
                        let k = f.read(&mut buf).map_err(|e| DataError::file(p, e))?;
                        if k == 0 {
                            break;
                        }
                        out.write_all(&buf[..k])
                            .map_err(|e| DataError::file(joined, e))?;
                    }
                }
                out.flush().map_err(|e| DataError::file(joined, e))?;
            }
        }
        if stop.load(Ordering::Relaxed) {
            return Err(stopped());
        }
        Ok(())
    }
}

/// The lowest rank whose step of a commit failed (`ok` is this rank's
/// outcome), `None` where every rank's went well: an AllReduce (min) of
/// one number, which fails where a peer died or aborted.
async fn first_failed(ctx: &Context, ok: bool) -> Result<Option<u32>, NodeError> {
    let n = i64::from(ctx.nranks());
    let mine = if ok { n } else { i64::from(ctx.rank()) };
    let v = allreduce(ctx, vec![mine], ReduceKind::Min)
        .await
        .map_err(DataError::from)?;
    match v.first() {
        Some(&r) if r >= n => Ok(None),
        Some(&r) => Ok(Some(u32::try_from(r).unwrap_or(u32::MAX))),
        None => Err(NodeError::other("the commit's agreement came back empty")),
    }
}

/// Commits of this process between their first file move and their end.
static PLACING: AtomicUsize = AtomicUsize::new(0);

/// How many commits of this process are moving files into place: a stop
/// signal that comes then should let them finish (their few renames and
/// agreements take milliseconds), since a rank stopped then, while others
/// keep their part, can leave a directory output mixed.
pub fn placing_outputs() -> usize {
    PLACING.load(Ordering::Relaxed)
}

/// Counts a commit in [`placing_outputs`] while held.
struct PlacingGuard;

impl PlacingGuard {
    fn new() -> Self {
        PLACING.fetch_add(1, Ordering::Relaxed);
        PlacingGuard
    }
}

impl Drop for PlacingGuard {
    fn drop(&mut self) {
        PLACING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A file move of a commit, undone if the commit does not finish.
#[derive(Debug)]
enum Moved {
    /// A new file at `dest`; `replaced` names the file it replaced (a
    /// second name, kept until the commit holds).
    Placed {
        dest: PathBuf,
        replaced: Option<PathBuf>,
    },
    /// An earlier run's file at `path` (one this run does not replace)
    /// moved aside to `aside`, to go once the commit holds.
    Aside { path: PathBuf, aside: PathBuf },
}

impl Moved {
    /// Puts back what was there before.
    fn undo(self) {
        match self {
            Moved::Placed {
                dest,
                replaced: Some(r),
            } => {
                let _ = std::fs::rename(r, dest);
            }
            Moved::Placed {
                dest,
                replaced: None,
            } => {
                let _ = std::fs::remove_file(dest);
            }
            Moved::Aside { path, aside } => {
                let _ = std::fs::rename(aside, path);
            }
        }
    }

    /// Keeps the new state: drops the earlier file.
    fn keep(self) {
        match self {
            Moved::Placed {
                replaced: Some(r), ..
            }
            | Moved::Aside { aside: r, .. } => {
                let _ = std::fs::remove_file(r);
            }
            Moved::Placed { replaced: None, .. } => {}
        }
    }
}

/// The suffix of the second name an earlier file has while a commit may
/// still be undone.
const REPLACED: &str = ".braid-replaced";

/// Where `dest`'s earlier file is kept while a commit may still be
/// undone: beside it, hidden in a directory output, under a name no
/// reader takes for data (`DIR/.part-00001.parquet.braid-replaced`,
/// `FILE.braid-replaced`).
fn replaced_path(dest: &Path, hidden: bool) -> PathBuf {
    beside(dest, if hidden { "." } else { "" }, REPLACED)
}

/// Moves `src` to `dest`. A file already at `dest` keeps a second name
/// (a hard link, so `dest` names a whole file at every instant, even where
/// the process is killed between the steps; moved aside first on a file
/// system without hard links). Refuses a directory at `dest`.
fn place(src: &Path, dest: &Path, hidden: bool) -> Result<Moved> {
    let replaced = match std::fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => {
            return Err(DataError::file(
                dest,
                "is a directory, which the output's file cannot replace",
            ));
        }
        Ok(_) => {
            let r = replaced_path(dest, hidden);
            // Left by a run killed in its commit: older than `dest`.
            let _ = std::fs::remove_file(&r);
            if std::fs::hard_link(dest, &r).is_err() {
                std::fs::rename(dest, &r).map_err(|e| DataError::file(dest, e))?;
            }
            Some(r)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(DataError::file(dest, e)),
    };
    if let Err(e) = std::fs::rename(src, dest) {
        if let Some(r) = &replaced {
            let _ = std::fs::rename(r, dest);
        }
        return Err(DataError::file(dest, e));
    }
    Ok(Moved::Placed {
        dest: dest.to_path_buf(),
        replaced,
    })
}

/// The names and paths of `dir`'s entries (none where it cannot be read).
fn dir_entries(dir: &Path) -> Vec<(String, PathBuf)> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect()
        })
        .unwrap_or_default()
}

/// Moves an earlier run's part that this run does not replace aside.
fn set_aside(path: &Path) -> Result<Moved> {
    if path.is_dir() {
        return Err(DataError::file(
            path,
            "is a directory named like a part file; move it out of the output directory",
        ));
    }
    let aside = replaced_path(path, true);
    std::fs::rename(path, &aside)
        .map_err(|e| DataError::file(path, format!("cannot remove the earlier part: {e}")))?;
    Ok(Moved::Aside {
        path: path.to_path_buf(),
        aside,
    })
}

/// A rank's staged part of a [`FileSink`]'s output (see
/// [`FileSink::staged`]).
pub struct Staged {
    sink: FileSink,
    part: PathBuf,
    staging: PathBuf,
    cleanup: Cleanup,
    armed: bool,
    /// What this rank moved while the commit may still fail: undone on
    /// drop, latest first.
    moved: Vec<Moved>,
    /// Set on drop: a join running on a blocking thread stops.
    stop: Arc<AtomicBool>,
    /// Directories above the staging area that did not exist when this
    /// was taken, deepest first: removed on an uncommitted drop where
    /// empty.
    made: Vec<PathBuf>,
}

/// What a rank's [`Staged`] dropped uncommitted removes of the staging
/// directory besides its own part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cleanup {
    /// All of it (rank 0).
    Whole,
    /// The directory if it is empty by then (every other rank): a rank
    /// that prepared after rank 0 had cleaned up made it again.
    IfEmpty,
}

impl Staged {
    /// Moves the output into place once every rank's graph succeeded: a
    /// barrier (a rank that failed has aborted the job, so this fails
    /// instead), then the commit of the module doc. On an error (here or
    /// on any rank), and where the returned future is dropped unfinished,
    /// the output is left as it was.
    pub async fn commit(mut self, ctx: &Context) -> Result<(), NodeError> {
        barrier(ctx).await.map_err(DataError::from)?;
        match self.sink.target.clone() {
            SinkTarget::Dir(dir) => self.commit_dir(ctx, &dir).await?,
            SinkTarget::File(file) => self.commit_file(ctx, &file).await?,
        }
        for m in self.moved.drain(..) {
            m.keep();
        }
        self.armed = false;
        if ctx.rank() == 0 {
            let _ = std::fs::remove_dir_all(&self.staging);
        }
        Ok(())
    }

    /// Each rank moves its part into `dir`, rank 0 the earlier run's other
    /// parts aside; kept once every rank's moves went well.
    async fn commit_dir(&mut self, ctx: &Context, dir: &Path) -> Result<(), NodeError> {
        let _placing = PlacingGuard::new();
        let (rank, n) = (ctx.rank(), ctx.nranks());
        let ext = self.sink.format.ext();
        let dest = dir.join(format!("part-{rank:05}.{ext}"));
        let mut mine = if self.skips_part(ctx).await? {
            // No part of this rank: an earlier run's goes aside.
            match std::fs::symlink_metadata(&dest) {
                Ok(_) => set_aside(&dest).map(|m| self.moved.push(m)),
                Err(_) => Ok(()),
            }
        } else {
            place(&self.part, &dest, true).map(|m| self.moved.push(m))
        };
        if rank == 0 && mine.is_ok() {
            // The earlier run's other parts, of either format (a directory
            // left holding both would be refused as input).
            let ours: Vec<String> = (0..n).map(|r| format!("part-{r:05}.{ext}")).collect();
            for (name, path) in dir_entries(dir) {
                if is_part_file(&name) && !ours.contains(&name) {
                    mine = set_aside(&path).map(|m| self.moved.push(m));
                    if mine.is_err() {
                        break;
                    }
                }
            }
        }
        let failed = first_failed(ctx, mine.is_ok()).await;
        mine?;
        if let Some(r) = failed? {
            return Err(relayed(
                r,
                DataError::file(
                    dir,
                    format!(
                        "rank {r} could not move its part into place; the output is left as it was"
                    ),
                ),
            ));
        }
        if rank == 0 {
            // Every rank's earlier files are obsolete now, also those a
            // rank killed in this or an earlier commit left behind.
            for (name, path) in dir_entries(dir) {
                if name.starts_with(".part-") && name.ends_with(REPLACED) {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        Ok(())
    }

    /// Whether this rank leaves its part out of a directory output: a CSV
    /// part with no rows, where another rank has rows (else rank 0 keeps
    /// its part, the header, so that the output still names its columns).
    /// A header-only CSV file has no types: Polars read a directory
    /// holding one first as all text, and pyarrow's dataset as all null
    /// (it failed on the next part's values). Parquet parts keep their
    /// schema with no rows, and are all kept. An agreement for CSV (a
    /// part that cannot be looked at counts as holding rows: its move
    /// then fails, and the commit's agreement with it).
    async fn skips_part(&self, ctx: &Context) -> Result<bool, NodeError> {
        if self.sink.format != FileFormat::Csv {
            return Ok(false);
        }
        let header = crate::csv_writer::header(&self.sink.schema).ok();
        let len = std::fs::metadata(&self.part).ok().map(|m| m.len());
        let empty = header.zip(len).is_some_and(|(h, l)| l == h.len() as u64);
        let any_rows = allreduce(ctx, vec![i64::from(!empty)], ReduceKind::Max)
            .await
            .map_err(DataError::from)?;
        Ok(empty && (any_rows.first() == Some(&1) || ctx.rank() != 0))
    }

    /// Rank 0 joins the parts into one file and moves it into place, each
    /// step agreed by every rank.
    async fn commit_file(&mut self, ctx: &Context, file: &Path) -> Result<(), NodeError> {
        let (rank, n) = (ctx.rank(), ctx.nranks());
        let joined = self
            .staging
            .join(format!("joined.{}", self.sink.format.ext()));
        let mine: Result<(), NodeError> = if rank == 0 {
            let parts: Vec<PathBuf> = (0..n).map(|r| self.sink.part(r)).collect();
            let (sink, stop, out) = (self.sink.clone(), self.stop.clone(), joined.clone());
            tokio::task::spawn_blocking(move || sink.join(&parts, &out, &stop))
                .await
                .map_err(NodeError::other)
                .and_then(|r| r.map_err(NodeError::from))
        } else {
            Ok(())
        };
        // A peer's failure meanwhile is the error (it may be why the join
        // failed: a stopped rank removes its part).
        let failed = first_failed(ctx, mine.is_ok()).await?;
        mine?;
        if let Some(r) = failed {
            return Err(relayed(
                r,
                DataError::file(
                    file,
                    "rank 0 could not join the ranks' parts; the output is left as it was",
                ),
            ));
        }
        let _placing = PlacingGuard::new();
        let mine = if rank == 0 {
            place(&joined, file, false).map(|m| self.moved.push(m))
        } else {
            Ok(())
        };
        let failed = first_failed(ctx, mine.is_ok()).await;
        mine?;
        if let Some(r) = failed? {
            return Err(relayed(
                r,
                DataError::file(
                    file,
                    "rank 0 could not move the joined file into place; the output is left as it was",
                ),
            ));
        }
        Ok(())
    }
}

/// A commit step's failure on rank `r` as every rank reports it: this
/// rank's own error where it is `r` (which returns its own error before
/// this), else passed on ([`braid_core::world::PeerFailure`]).
fn relayed(r: u32, e: DataError) -> NodeError {
    NodeError::other(braid_core::world::PeerFailure {
        peer: r,
        detail: e.to_string(),
    })
}

/// The staging areas of this process's live [`Staged`] guards (one
/// entry per guard).
static LIVE_STAGED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn live_staged() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    LIVE_STAGED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Drop for Staged {
    fn drop(&mut self) {
        {
            let mut live = live_staged();
            if let Some(i) = live.iter().position(|p| *p == self.staging) {
                live.swap_remove(i);
            }
        }
        self.stop.store(true, Ordering::Relaxed);
        while let Some(m) = self.moved.pop() {
            m.undo();
        }
        if self.armed {
            let _ = std::fs::remove_file(&self.part);
            let _ = match self.cleanup {
                Cleanup::Whole => std::fs::remove_dir_all(&self.staging),
                Cleanup::IfEmpty => std::fs::remove_dir(&self.staging),
            };
            remove_made(&self.made);
        }
    }
}

/// Collects a stream into memory (tests, small results).
#[derive(Debug, Clone, Default)]
pub struct CollectSink {
    batches: Arc<Mutex<Vec<RecordBatch>>>,
}

impl CollectSink {
    /// An empty collector.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes every chunk of `input`.
    pub async fn run(self, mut input: Receiver) -> Result<(), NodeError> {
        while let Some(m) = input.recv().await {
            if let Payload::Table(t) = m.payload {
                self.batches
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(t.into_batch());
            }
        }
        Ok(())
    }

    /// What was collected.
    pub fn batches(&self) -> Vec<RecordBatch> {
        self.batches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use arrow_array::{
        Array, ArrayRef, Float64Array, Int64Array, TimestampMillisecondArray, TimestampSecondArray,
    };
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    /// `batch` written as the sink writes a Parquet part, at `path`, and
    /// a reader of that file.
    fn write_and_reopen(path: &Path, batch: RecordBatch) -> ParquetRecordBatchReaderBuilder<File> {
        let schema = batch.schema();
        let sink = FileSink {
            format: FileFormat::Parquet,
            target: SinkTarget::File(path.to_path_buf()),
            schema: schema.clone(),
        };
        let pq = parquet_schema(&schema);
        match sink.open(path).unwrap() {
            Writer::Parquet(mut w) => {
                w.write(&to_parquet_batch(batch, &pq).unwrap()).unwrap();
                w.close().unwrap();
            }
            Writer::Csv(_) => unreachable!(),
        }
        ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap()
    }

    /// Chunks of large rows reach the Parquet writer in slices of ~4 MiB
    /// (so it can cut row groups near 64 MiB); small chunks, and slices
    /// of a large batch, go whole.
    #[test]
    fn large_rows_are_written_in_row_group_pieces() {
        let big: String = "x".repeat(50_000);
        let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, false)]));
        let b = RecordBatch::try_new(
            schema,
            vec![Arc::new(arrow_array::StringArray::from(vec![
                big.as_str();
                600
            ]))],
        )
        .unwrap();
        let pieces = row_group_pieces(&b);
        assert_eq!(pieces.iter().map(|p| p.num_rows()).sum::<usize>(), 600);
        assert!(pieces.len() >= 7, "{} pieces", pieces.len());
        for p in &pieces {
            let rows = p.num_rows();
            assert!(
                rows * 50_000 <= (ROW_GROUP_BYTES / 16) + 50_000,
                "{rows} rows"
            );
        }
        assert_eq!(row_group_pieces(&b.slice(100, 10)).len(), 1);
        let narrow = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("i", DataType::Int64, false)])),
            vec![Arc::new(Int64Array::from_iter_values(0..65_536))],
        )
        .unwrap();
        assert_eq!(row_group_pieces(&narrow).len(), 1);
        assert!(row_group_pieces(&narrow.slice(0, 0)).is_empty());
    }

    /// A path ending in `/` is a directory whatever its name (`out.csv/`
    /// was taken for a file, and failed after the whole job).
    #[test]
    fn a_trailing_separator_makes_a_directory() {
        let t = |p: &str, f| SinkTarget::from_path(PathBuf::from(p), f);
        assert!(matches!(t("o.csv", FileFormat::Csv), SinkTarget::File(_)));
        assert!(matches!(t("o.csv/", FileFormat::Csv), SinkTarget::Dir(_)));
        assert!(matches!(
            t("o.PARQUET/", FileFormat::Parquet),
            SinkTarget::Dir(_)
        ));
        assert!(matches!(t("o", FileFormat::Parquet), SinkTarget::Dir(_)));
    }

    /// A float column of 50K distinct values (an aggregate's) is written
    /// plain past its first 64 KiB of dictionary (it kept a 400 KB one,
    /// hashing every value of every row group); floats of few distinct
    /// values, and other types, keep their dictionary. A wide part's row
    /// groups are cut by their bytes, not only at 1M rows.
    #[test]
    fn distinct_floats_fall_back_to_plain_early_and_wide_groups_are_cut() {
        let dir = std::env::temp_dir().join(format!("braid-sink-dict-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let n = 50_000usize;
        let schema = Arc::new(Schema::new(vec![
            Field::new("distinct", DataType::Float64, false),
            Field::new("cents", DataType::Float64, false),
            Field::new("id", DataType::Int64, false),
        ]));
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Float64Array::from_iter_values(
                (0..n).map(|i| (i as f64).sqrt()),
            )),
            Arc::new(Float64Array::from_iter_values(
                (0..n).map(|i| (i % 100) as f64 / 100.0),
            )),
            Arc::new(Int64Array::from_iter_values((0..n as i64).map(|i| i * 7))),
        ];
        let b = RecordBatch::try_new(schema, cols).unwrap();
        let meta = write_and_reopen(&dir.join("d.parquet"), b)
            .metadata()
            .clone();
        // A chunk's dictionary page: the bytes before its first data page.
        let dictionary = |c: usize| {
            let m = meta.row_group(0).column(c);
            m.dictionary_page_offset().map(|d| m.data_page_offset() - d)
        };
        let kb = |c| dictionary(c).map(|b| b / 1024);
        assert!(
            kb(0).is_some_and(|k| k <= 80),
            "the distinct floats' dictionary: {:?} KiB",
            kb(0)
        );
        assert!(kb(1).is_some(), "the few floats lost their dictionary");
        // Integers keep the default limit (50K of them: 400 KB, ~200 KB
        // compressed).
        assert!(kb(2).is_some_and(|k| k > 120), "{:?} KiB", kb(2));
        // 200 columns of distinct floats: ~80 MB a million rows, over the
        // 64 MiB a row group may hold.
        let wide = Arc::new(Schema::new(
            (0..200)
                .map(|c| Field::new(format!("f{c}"), DataType::Float64, false))
                .collect::<Vec<_>>(),
        ));
        let rows = 60_000usize;
        let cols: Vec<ArrayRef> = (0..200)
            .map(|c| {
                Arc::new(Float64Array::from_iter_values(
                    (0..rows).map(move |i| (i * 200 + c) as f64 * 1.000001),
                )) as ArrayRef
            })
            .collect();
        let b = RecordBatch::try_new(wide, cols).unwrap();
        let path = dir.join("w.parquet");
        let sink = FileSink {
            format: FileFormat::Parquet,
            target: SinkTarget::File(path.clone()),
            schema: b.schema(),
        };
        match sink.open(&path).unwrap() {
            Writer::Parquet(mut w) => {
                for _ in 0..10 {
                    w.write(&b).unwrap();
                }
                w.close().unwrap();
            }
            Writer::Csv(_) => unreachable!(),
        }
        let groups = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap())
            .unwrap()
            .metadata()
            .num_row_groups();
        assert!(groups >= 2, "600K wide rows in {groups} row group");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A CSV output of nested columns is refused before any rank starts,
    /// naming the output and the column, with nothing staged (it failed
    /// in a rank's sink, naming its staged part).
    #[test]
    fn csv_output_of_nested_columns_is_refused_when_prepared() {
        let dir = std::env::temp_dir().join(format!("braid-sink-nested-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let schema = Arc::new(Schema::new(vec![
            Field::new("ts", DataType::Int64, false),
            Field::new_list("l", Field::new_list_field(DataType::Int64, true), true),
        ]));
        for target in [
            SinkTarget::Dir(dir.join("out")),
            SinkTarget::File(dir.join("out.csv")),
        ] {
            let sink = FileSink {
                format: FileFormat::Csv,
                target: target.clone(),
                schema: schema.clone(),
            };
            let e = sink.prepare().unwrap_err().to_string();
            assert!(
                e.contains(&target.path().display().to_string())
                    && e.contains("column \"l\" has the nested type")
                    && !e.contains("staging"),
                "{e}"
            );
            assert!(!target.staging().exists());
            // Parquet holds it.
            let sink = FileSink {
                format: FileFormat::Parquet,
                ..sink
            };
            sink.prepare().unwrap();
            // Nothing made to check it stays (the sink makes the staging
            // directory when it writes).
            assert!(!target.staging().exists() && !dir.exists());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn second_timestamps_are_written_as_parquet_timestamps_in_ms() {
        let dir = std::env::temp_dir().join(format!("braid-sink-secs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.parquet");
        let schema = Arc::new(Schema::new(vec![
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Second, Some("UTC".into())),
                false,
            ),
            Field::new("x", DataType::Int64, false),
        ]));
        let secs = [-5i64, 0, 1_700_000_000];
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(TimestampSecondArray::from(secs.to_vec()).with_timezone("UTC")),
                Arc::new(Int64Array::from(vec![1, 2, 3])),
            ],
        )
        .unwrap();
        let b = write_and_reopen(&path, batch);
        // The Parquet column carries a timestamp logical type (readers
        // that ignore the embedded Arrow schema still see a timestamp).
        let col = b.parquet_schema().column(0);
        assert!(
            matches!(
                col.logical_type_ref(),
                Some(parquet::basic::LogicalType::Timestamp { .. })
            ),
            "{:?}",
            col.logical_type_ref()
        );
        let got = b.build().unwrap().next().unwrap().unwrap();
        let ts = got
            .column(0)
            .as_any()
            .downcast_ref::<TimestampMillisecondArray>()
            .unwrap();
        assert_eq!(ts.timezone(), Some("UTC"));
        let want: Vec<i64> = secs.iter().map(|s| s * 1000).collect();
        assert_eq!(ts.values().to_vec(), want);
        assert!(ts.nulls().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A `date64` column is written as Parquet's DATE (`date32`), as
    /// pyarrow writes it: stored as a bare INT64 before, pyarrow and DuckDB
    /// read it back as plain integers of milliseconds.
    #[test]
    fn date64_is_written_as_a_parquet_date() {
        use arrow_array::{Date32Array, Date64Array};
        let dir = std::env::temp_dir().join(format!("braid-sink-date64-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.parquet");
        let schema = Arc::new(Schema::new(vec![Field::new("d", DataType::Date64, true)]));
        let days = [-3i64, 0, 19_723];
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Date64Array::from(vec![
                Some(days[0] * 86_400_000),
                None,
                Some(days[1] * 86_400_000),
                Some(days[2] * 86_400_000),
            ]))],
        )
        .unwrap();
        let b = write_and_reopen(&path, batch);
        let col = b.parquet_schema().column(0);
        assert_eq!(
            col.logical_type_ref(),
            Some(&parquet::basic::LogicalType::Date)
        );
        let got = b.build().unwrap().next().unwrap().unwrap();
        let d = got
            .column(0)
            .as_any()
            .downcast_ref::<Date32Array>()
            .unwrap();
        let want: Vec<Option<i32>> = vec![Some(-3), None, Some(0), Some(19_723)];
        assert_eq!(d.iter().collect::<Vec<_>>(), want);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Dates of 64 bits inside a struct, a list or a dictionary are
    /// written as Parquet dates too (they were bare INT64s, which DuckDB
    /// and pyarrow read back as integers).
    #[test]
    fn date64_inside_nested_columns_is_written_as_a_parquet_date() {
        use arrow_array::{Date32Array, Date64Array, StructArray};
        let dir = std::env::temp_dir().join(format!("braid-sink-date64n-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("n.parquet");
        let d = Arc::new(Date64Array::from(vec![Some(0), Some(86_400_000), None]));
        let s = StructArray::from(vec![(
            Arc::new(Field::new("d", DataType::Date64, true)),
            d.clone() as arrow_array::ArrayRef,
        )]);
        let dict = arrow_cast::cast(
            d.as_ref(),
            &DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Date64)),
        )
        .unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("s", s.data_type().clone(), true),
            Field::new("k", dict.data_type().clone(), true),
        ]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(s), dict]).unwrap();
        let got = write_and_reopen(&path, batch)
            .build()
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        let want: Vec<Option<i32>> = vec![Some(0), Some(1), None];
        let inner = got
            .column(0)
            .as_any()
            .downcast_ref::<StructArray>()
            .unwrap()
            .column(0)
            .clone();
        let k = arrow_cast::cast(got.column(1), &DataType::Date32).unwrap();
        for c in [inner, k] {
            let c = c.as_any().downcast_ref::<Date32Array>().unwrap();
            assert_eq!(c.iter().collect::<Vec<_>>(), want);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// CSV cannot hold bytes (Arrow writes them as bare hex, which reads
    /// back as text or numbers): a binary column is refused, as a nested
    /// one is, naming it.
    #[test]
    fn csv_refuses_binary_columns() {
        for t in [
            DataType::Binary,
            DataType::LargeBinary,
            DataType::FixedSizeBinary(4),
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Binary)),
        ] {
            let schema = Schema::new(vec![
                Field::new("ts", DataType::Int64, false),
                Field::new("b", t.clone(), true),
            ]);
            let e = crate::csv_writer::unwritable(&schema).unwrap_or_default();
            assert!(e.contains("column \"b\" has the binary type"), "{t}: {e}");
        }
        let text = Schema::new(vec![Field::new("s", DataType::Utf8, true)]);
        assert_eq!(crate::csv_writer::unwritable(&text), None);
    }

    /// Runs `n` local ranks, each writing `rows(rank)` through `sink` and
    /// committing; every rank's outcome, by rank.
    fn write_and_commit(
        sink: &FileSink,
        n: u32,
        rows: impl Fn(u32) -> RecordBatch,
        between: impl FnOnce(),
    ) -> Vec<Result<(), NodeError>> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        sink.prepare().unwrap();
        let staged: Vec<Staged> = (0..n).map(|r| sink.staged(r)).collect();
        rt.block_on(async {
            let ctxs = braid_core::world::contexts(
                &braid_core::WorldSpec::Local { nranks: n },
                braid_core::MemoryLimits::UNLIMITED,
            )
            .await
            .unwrap();
            // Every part written first, then `between`, then the commits.
            for ctx in &ctxs {
                let (mut tx, rx) = braid_core::channel(4);
                tx.send(braid_core::Message::new(0, rows(ctx.rank())))
                    .await
                    .unwrap();
                drop(tx);
                sink.clone().write(ctx.clone(), rx).await.unwrap();
            }
            between();
            let runs = ctxs.into_iter().zip(staged).map(|(ctx, st)| {
                tokio::spawn(async move {
                    let r = st.commit(&ctx).await;
                    if r.is_err() {
                        ctx.comm().abort("commit failed");
                    }
                    r
                })
            });
            futures::future::join_all(runs)
                .await
                .into_iter()
                .map(|r| r.unwrap())
                .collect()
        })
    }

    /// One Int64 column `x` of `rank * 10 + i` for i < 3.
    fn rank_rows(schema: &SchemaRef, rank: u32) -> RecordBatch {
        let x: Vec<i64> = (0..3).map(|i| i64::from(rank) * 10 + i).collect();
        RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(x))]).unwrap()
    }

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// A directory commit that fails on one rank (its part's place is a
    /// directory) fails on every rank and leaves the earlier run's output
    /// as it was: before, the other ranks' new parts replaced theirs and
    /// the earlier run's other parts were deleted, a partial output that
    /// looked whole.
    #[test]
    fn a_directory_commit_failing_on_one_rank_leaves_the_earlier_output() {
        let base = std::env::temp_dir().join(format!("braid-sink-undo-{}", std::process::id()));
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        for n in [1u32, 2, 3, 4, 5, 8] {
            let dir = base.join(format!("n{n}"));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            // The earlier run: n + 1 parts (one past this job's ranks).
            for r in 0..=n {
                std::fs::write(dir.join(format!("part-{r:05}.csv")), format!("x\nold{r}\n"))
                    .unwrap();
            }
            let sink = FileSink {
                format: FileFormat::Csv,
                target: SinkTarget::Dir(dir.clone()),
                schema: schema.clone(),
            };
            let bad = n - 1;
            let blocker = dir.join(format!("part-{bad:05}.csv"));
            let outcomes = write_and_commit(
                &sink,
                n,
                |r| rank_rows(&schema, r),
                || {
                    std::fs::remove_file(&blocker).unwrap();
                    std::fs::create_dir_all(blocker.join("x")).unwrap();
                },
            );
            for (r, o) in outcomes.iter().enumerate() {
                assert!(o.is_err(), "n {n}: rank {r} committed");
            }
            let e = outcomes[bad as usize].as_ref().unwrap_err().to_string();
            assert!(e.contains("is a directory"), "n {n}: {e}");
            let mut want: Vec<String> = (0..=n).map(|r| format!("part-{r:05}.csv")).collect();
            want.sort();
            assert_eq!(names(&dir), want, "n {n}");
            for r in (0..=n).filter(|r| *r != bad) {
                let text = std::fs::read_to_string(dir.join(format!("part-{r:05}.csv"))).unwrap();
                assert_eq!(text, format!("x\nold{r}\n"), "n {n}: part {r}");
            }
            assert!(!sink.target.staging().exists(), "n {n}");
            std::fs::remove_dir_all(&blocker).unwrap();
            std::fs::write(&blocker, format!("x\nold{bad}\n")).unwrap();
            // An earlier part past this job's ranks that cannot go (a
            // directory named like one) fails the commit the same way.
            let extra = dir.join(format!("part-{:05}.parquet", n + 3));
            std::fs::create_dir_all(extra.join("x")).unwrap();
            let outcomes = write_and_commit(&sink, n, |r| rank_rows(&schema, r), || {});
            assert!(outcomes.iter().all(|o| o.is_err()), "n {n}: {outcomes:?}");
            let e = outcomes[0].as_ref().unwrap_err().to_string();
            assert!(
                e.contains("is a directory named like a part file"),
                "n {n}: {e}"
            );
            for r in 0..=n {
                let text = std::fs::read_to_string(dir.join(format!("part-{r:05}.csv"))).unwrap();
                assert_eq!(text, format!("x\nold{r}\n"), "n {n}: part {r}");
            }
            std::fs::remove_dir_all(&extra).unwrap();
            // Without them the same job replaces every part, and drops
            // the second names a killed run left.
            std::fs::write(dir.join(".part-00009.csv.braid-replaced"), "stale").unwrap();
            let outcomes = write_and_commit(&sink, n, |r| rank_rows(&schema, r), || {});
            assert!(outcomes.iter().all(|o| o.is_ok()), "n {n}: {outcomes:?}");
            let want: Vec<String> = (0..n).map(|r| format!("part-{r:05}.csv")).collect();
            assert_eq!(names(&dir), want, "n {n}");
            for r in 0..n {
                let text = std::fs::read_to_string(dir.join(format!("part-{r:05}.csv"))).unwrap();
                let want: String = (0..3).map(|i| format!("{}\n", r * 10 + i)).collect();
                assert_eq!(text, format!("x\n{want}"), "n {n}: part {r}");
            }
        }
        let _ = std::fs::remove_dir_all(&base);
    }

    /// A one-file output whose place turns out to be taken by a directory
    /// fails on every rank, with nothing moved and no staging left.
    #[test]
    fn a_one_file_commit_that_cannot_be_placed_fails_everywhere() {
        let base = std::env::temp_dir().join(format!("braid-sink-place-{}", std::process::id()));
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        for n in [1u32, 2, 3, 4, 5, 8] {
            let _ = std::fs::remove_dir_all(&base);
            std::fs::create_dir_all(&base).unwrap();
            let file = base.join("out.parquet");
            let sink = FileSink {
                format: FileFormat::Parquet,
                target: SinkTarget::File(file.clone()),
                schema: schema.clone(),
            };
            let outcomes = write_and_commit(
                &sink,
                n,
                |r| rank_rows(&schema, r),
                || {
                    std::fs::create_dir_all(file.join("x")).unwrap();
                },
            );
            assert!(outcomes.iter().all(|o| o.is_err()), "n {n}: {outcomes:?}");
            assert!(file.join("x").is_dir());
            assert_eq!(names(&base), ["out.parquet"], "n {n}");
        }
        let _ = std::fs::remove_dir_all(&base);
    }

    /// A one-file CSV output whose column name holds a line break is
    /// joined past each part's whole header: before, the header's second
    /// line stayed in the file as a row for every part after the first.
    #[test]
    fn a_joined_csv_skips_headers_that_span_lines() {
        let base = std::env::temp_dir().join(format!("braid-sink-head-{}", std::process::id()));
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("multi\nline, \"q\"", DataType::Int64, false),
        ]));
        for n in [1u32, 2, 3, 4, 5, 8] {
            let _ = std::fs::remove_dir_all(&base);
            std::fs::create_dir_all(&base).unwrap();
            let file = base.join("out.csv");
            let sink = FileSink {
                format: FileFormat::Csv,
                target: SinkTarget::File(file.clone()),
                schema: schema.clone(),
            };
            let rows = |r: u32| {
                let id: Vec<i64> = (0..2).map(|i| i64::from(r) * 10 + i).collect();
                let v: Vec<i64> = id.iter().map(|x| x * 7).collect();
                RecordBatch::try_new(
                    schema.clone(),
                    vec![
                        Arc::new(Int64Array::from(id)),
                        Arc::new(Int64Array::from(v)),
                    ],
                )
                .unwrap()
            };
            let outcomes = write_and_commit(&sink, n, rows, || {});
            assert!(outcomes.iter().all(|o| o.is_ok()), "n {n}: {outcomes:?}");
            let got: Vec<RecordBatch> = arrow_csv::ReaderBuilder::new(schema.clone())
                .with_header(true)
                .build(File::open(&file).unwrap())
                .unwrap()
                .map(|b| b.unwrap())
                .collect();
            let got = arrow_select::concat::concat_batches(&schema, &got).unwrap();
            let want: Vec<RecordBatch> = (0..n).map(rows).collect();
            let want = arrow_select::concat::concat_batches(&schema, &want).unwrap();
            assert_eq!(got, want, "n {n}");
            assert_eq!(names(&base), ["out.csv"], "n {n}");
        }
        let _ = std::fs::remove_dir_all(&base);
    }

    /// A join told to stop (its commit abandoned) ends with an error.
    #[test]
    fn a_stopped_join_ends() {
        let base = std::env::temp_dir().join(format!("braid-sink-stop-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        for format in [FileFormat::Csv, FileFormat::Parquet] {
            let sink = FileSink {
                format,
                target: SinkTarget::File(base.join(format!("out.{}", format.ext()))),
                schema: schema.clone(),
            };
            let part = base.join(format!("p.{}", format.ext()));
            match sink.open(&part).unwrap() {
                Writer::Parquet(w) => w.close().unwrap(),
                Writer::Csv(w) => w.finish().unwrap(),
            }
            let joined = base.join(format!("j.{}", format.ext()));
            sink.join(
                std::slice::from_ref(&part),
                &joined,
                &AtomicBool::new(false),
            )
            .unwrap();
            let e = sink
                .join(&[part.clone(), part], &joined, &AtomicBool::new(true))
                .unwrap_err();
            assert!(e.to_string().contains("stopped"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&base);
    }

    /// Ranks check one output at once (processes of a tcp or MPI job):
    /// every check passes and none leaves a directory behind. (Checks that
    /// made the staging directory and removed it again failed each other
    /// with "the output directory is an existing file".)
    #[test]
    fn ranks_prepare_one_output_at_once() {
        let dir = std::env::temp_dir().join(format!("braid-sink-race-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        for target in [
            SinkTarget::Dir(dir.join("out")),
            SinkTarget::File(dir.join("one.parquet")),
        ] {
            let sink = FileSink {
                format: FileFormat::Parquet,
                target,
                schema: schema.clone(),
            };
            std::thread::scope(|s| {
                for _ in 0..8 {
                    s.spawn(|| {
                        for _ in 0..200 {
                            sink.prepare().unwrap();
                        }
                    });
                }
            });
        }
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A failed job leaves no staging directory, whatever order its ranks
    /// fail in: rank 0 cleaned up first, then rank 1 wrote (making the
    /// directory again) and failed with a part staged; every rank's guard
    /// dropped uncommitted. Rank 1's guard removed only its part before,
    /// and the directory stayed.
    #[test]
    fn ranks_failing_in_any_order_leave_no_staging() {
        let dir = std::env::temp_dir().join(format!("braid-sink-stage-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let sink = FileSink {
            format: FileFormat::Csv,
            target: SinkTarget::Dir(dir.clone()),
            schema,
        };
        let staging = sink.target.staging();
        // (As the sink's writers make it.)
        std::fs::create_dir_all(&staging).unwrap();
        let (r0, r1, r2) = (sink.staged(0), sink.staged(1), sink.staged(2));
        drop(r0);
        assert!(!staging.exists(), "rank 0 removes the staging directory");
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::write(sink.part(1), "x\n1\n").unwrap();
        std::fs::write(sink.part(2), "x\n2\n").unwrap();
        drop(r1);
        assert!(staging.exists(), "rank 2's part is still there");
        drop(r2);
        assert!(!staging.exists(), "the last rank out removes it");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A job that fails (its guards dropped uncommitted, then its lock)
    /// removes the directories it made for the output, the output
    /// directory and its missing parents, taken with the lock or only by
    /// the writers; it leaves a directory that existed before, and one
    /// that holds anything (a committed output).
    #[test]
    fn a_failed_job_leaves_no_directory_it_made() {
        let base = std::env::temp_dir().join(format!("braid-sink-made-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("kept")).unwrap();
        std::fs::write(base.join("kept/other.txt"), "x").unwrap();
        std::fs::create_dir_all(base.join("empty")).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let sink = |target| FileSink {
            format: FileFormat::Csv,
            target,
            schema: schema.clone(),
        };
        for (target, locked, committed) in [
            (SinkTarget::Dir(base.join("a/b/out")), true, false),
            (SinkTarget::Dir(base.join("a/b/out")), false, false),
            (SinkTarget::File(base.join("a/b/out.csv")), true, false),
            (SinkTarget::File(base.join("a/b/out.csv")), false, false),
            (SinkTarget::Dir(base.join("kept")), true, false),
            // `new/../empty` names `empty`, which existed (empty): never
            // removed (it was, taken for one the job made).
            (SinkTarget::Dir(base.join("new/../empty")), true, false),
            (SinkTarget::Dir(base.join("a/b/out")), true, true),
        ] {
            let what = format!("{target:?}, locked {locked}, committed {committed}");
            let s = sink(target);
            s.prepare().unwrap();
            let lock = locked.then(|| s.lock().unwrap());
            let guards = [s.staged(0), s.staged(1)];
            for r in 0..2 {
                drop(s.open(&s.part(r)).unwrap());
            }
            if committed {
                // What a commit leaves: the output's files in place.
                std::fs::write(s.target.path().join("part-00000.csv"), "x\n").unwrap();
            }
            drop(guards);
            drop(lock);
            if committed {
                assert!(s.target.path().join("part-00000.csv").exists(), "{what}");
                std::fs::remove_dir_all(base.join("a")).unwrap();
            }
            assert!(
                !base.join("a").exists(),
                "{what}: left {:?}",
                base.join("a")
            );
            assert_eq!(
                std::fs::read_to_string(base.join("kept/other.txt")).unwrap(),
                "x",
                "{what}"
            );
            assert!(base.join("empty").is_dir(), "{what}");
            // (A `..` path's own levels are left: only `new` here.)
            let _ = std::fs::remove_dir(base.join("new"));
            let mut left: Vec<_> = std::fs::read_dir(&base)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            left.sort();
            assert_eq!(
                left,
                ["empty", "kept"].map(std::ffi::OsString::from),
                "{what}"
            );
        }
        let _ = std::fs::remove_dir_all(&base);
    }

    /// An output directory named like an existing plain file is refused
    /// as such, with a hint, and the file is left as it was (before, the
    /// error was the OS's "Not a directory" for the staging path).
    #[test]
    fn an_output_directory_that_is_a_file_is_refused() {
        let file =
            std::env::temp_dir().join(format!("braid-sink-isfile-{}.txt", std::process::id()));
        std::fs::write(&file, "keep").unwrap();
        let sink = FileSink {
            format: FileFormat::Csv,
            target: SinkTarget::Dir(file.clone()),
            schema: Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)])),
        };
        let e = sink.prepare().unwrap_err().to_string();
        assert!(e.contains("existing file") && e.contains(".parquet"), "{e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
        let _ = std::fs::remove_file(&file);
    }

    /// A chunk whose columns differ from the sink's schema (here swapped)
    /// fails the sink with both column lists: before, a Parquet part cast
    /// the floats into the integer column by position (1.5 -> 1), and a CSV
    /// part wrote them under the other column's header.
    #[test]
    fn a_chunk_with_other_columns_fails_instead_of_being_written_wrong() {
        use arrow_array::{Float64Array, Int64Array};
        let dir = std::env::temp_dir().join(format!("braid-sink-cols-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let declared = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Float64, false),
        ]));
        let swapped = Arc::new(Schema::new(vec![
            Field::new("b", DataType::Float64, true),
            Field::new("a", DataType::Int64, true),
        ]));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for format in [FileFormat::Parquet, FileFormat::Csv] {
            let sink = FileSink {
                format,
                target: SinkTarget::Dir(dir.clone()),
                schema: declared.clone(),
            };
            sink.prepare().unwrap();
            let part = sink.part(0);
            let run = |schema: SchemaRef, cols: Vec<arrow_array::ArrayRef>| {
                let batch = RecordBatch::try_new(schema, cols).unwrap();
                let (mut tx, mut rx) = braid_core::channel(4);
                rt.block_on(async {
                    tx.send(braid_core::Message::new(0, batch)).await.unwrap();
                    drop(tx);
                    sink.write_part(&mut rx, &part)
                        .await
                        .err()
                        .map(|e| e.to_string())
                })
            };
            let e = run(
                swapped.clone(),
                vec![
                    Arc::new(Float64Array::from(vec![1.5, 2.5])),
                    Arc::new(Int64Array::from(vec![10, 20])),
                ],
            );
            assert!(
                e.as_ref()
                    .is_some_and(|e| e.contains("b: Float64, a: Int64")
                        && e.contains("a: Int64, b: Float64")),
                "{format:?}: {e:?}"
            );
            // The declared columns, nullable or not, are written.
            let ok = run(
                Arc::new(Schema::new(vec![
                    Field::new("a", DataType::Int64, true),
                    Field::new("b", DataType::Float64, true),
                ])),
                vec![
                    Arc::new(Int64Array::from(vec![1, 2])),
                    Arc::new(Float64Array::from(vec![0.5, 1.5])),
                ],
            );
            assert_eq!(ok, None, "{format:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A run into a directory replaces every part an earlier run left
    /// there, of either format (a directory of both is refused as input),
    /// and nothing else.
    #[test]
    fn a_run_replaces_earlier_parts_of_either_format_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("braid-sink-replace-{}", std::process::id()));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        for (format, ours) in [
            (FileFormat::Csv, "part-00000.csv"),
            (FileFormat::Parquet, "part-00000.parquet"),
        ] {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let old = ["part-00000.parquet", "part-00003.csv", "part-7.parquet"];
            let kept = ["part-notes.csv", "part-00001.txt", "readme.parquet"];
            for f in old.iter().chain(&kept) {
                std::fs::write(dir.join(f), "old").unwrap();
            }
            let sink = FileSink {
                format,
                target: SinkTarget::Dir(dir.clone()),
                schema: schema.clone(),
            };
            sink.prepare().unwrap();
            let staged = sink.staged(0);
            rt.block_on(async {
                let ctx = braid_core::world::contexts(
                    &braid_core::WorldSpec::Local { nranks: 1 },
                    braid_core::MemoryLimits::UNLIMITED,
                )
                .await
                .unwrap()
                .remove(0);
                let batch = RecordBatch::try_new(
                    schema.clone(),
                    vec![Arc::new(Int64Array::from(vec![1, 2]))],
                )
                .unwrap();
                let (mut tx, rx) = braid_core::channel(4);
                tx.send(braid_core::Message::new(0, batch)).await.unwrap();
                drop(tx);
                sink.clone().write(ctx.clone(), rx).await.unwrap();
                staged.commit(&ctx).await.unwrap();
            });
            let mut names: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            let mut want: Vec<String> = kept.iter().map(|s| s.to_string()).collect();
            want.push(ours.to_string());
            want.sort();
            assert_eq!(names, want, "{format:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A CSV directory output leaves out the parts of ranks with no rows
    /// (and an earlier run's parts of those numbers), unless no rank has
    /// rows: then part 0 alone holds the header. Parquet keeps every part.
    #[test]
    fn csv_directories_leave_out_parts_without_rows() {
        let dir = std::env::temp_dir().join(format!("braid-sink-empty-{}", std::process::id()));
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let rows = |empty: &'static [u32]| {
            let schema = schema.clone();
            move |r: u32| {
                let b = rank_rows(&schema, r);
                if empty.contains(&r) { b.slice(0, 0) } else { b }
            }
        };
        let cases: [(FileFormat, &[u32], &[&str]); 3] = [
            (
                FileFormat::Csv,
                &[1, 3],
                &["part-00000.csv", "part-00002.csv"],
            ),
            (FileFormat::Csv, &[0, 1, 2, 3], &["part-00000.csv"]),
            (
                FileFormat::Parquet,
                &[1, 3],
                &[
                    "part-00000.parquet",
                    "part-00001.parquet",
                    "part-00002.parquet",
                    "part-00003.parquet",
                ],
            ),
        ];
        for (format, empty, want) in cases {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            for r in 0..4 {
                std::fs::write(dir.join(format!("part-{r:05}.{}", format.ext())), "old").unwrap();
            }
            let sink = FileSink {
                format,
                target: SinkTarget::Dir(dir.clone()),
                schema: schema.clone(),
            };
            for r in write_and_commit(&sink, 4, rows(empty), || {}) {
                r.unwrap();
            }
            assert_eq!(names(&dir), want.to_vec(), "{format:?}, empty {empty:?}");
            if format == FileFormat::Csv {
                for name in want {
                    let r: u32 = name[5..10].parse().unwrap();
                    let text = std::fs::read_to_string(dir.join(name)).unwrap();
                    let mut lines = vec!["x".to_string()];
                    if !empty.contains(&r) {
                        lines.extend((0..3).map(|i| (r * 10 + i).to_string()));
                    }
                    assert_eq!(text, lines.join("\n") + "\n", "{name}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A rank that opens its part after another rank failed and removed
    /// the staging directory still opens it, so that it fails with its own
    /// error (or the job's abort), not "No such file or directory", which
    /// hid the cause when it was the error reported; its guard then
    /// removes the directory again.
    #[test]
    fn a_part_opened_after_another_rank_cleaned_up_still_opens() {
        let dir = std::env::temp_dir().join(format!("braid-sink-reopen-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        for format in [FileFormat::Csv, FileFormat::Parquet] {
            let sink = FileSink {
                format,
                target: SinkTarget::Dir(dir.clone()),
                schema: schema.clone(),
            };
            let staging = sink.target.staging();
            sink.prepare().unwrap();
            let (r0, r1) = (sink.staged(0), sink.staged(1));
            drop(r0);
            assert!(!staging.exists());
            let w = sink.open(&sink.part(1));
            assert!(
                w.is_ok(),
                "{format:?}: {:?}",
                w.err().map(|e| e.to_string())
            );
            drop(w);
            drop(r1);
            assert!(!staging.exists(), "{format:?}: rank 1's guard removes it");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
