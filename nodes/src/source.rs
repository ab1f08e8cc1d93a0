//! Sources: nodes that read a table and send it downstream in chunks.
//!
//! | source | how the work is split across ranks |
//! |---|---|
//! | Parquet (file or directory) | row groups (cut into row ranges when there are fewer than ranks), round-robin |
//! | CSV (file or directory) | chunks of `chunk_rows` rows, round-robin |
//! | in-memory batches | each rank sends the batches it was given |
//! | generator | rows split evenly; each rank makes its own share |
//!
//! Every rank knows the schema (from the file's footer, by inference, or by
//! construction) even when it gets no rows, so downstream nodes and sinks
//! can always produce well-typed, possibly empty, output.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use braid_core::{Context, Message, NodeError, Sender};
use braid_kernels::hash::{GOLDEN, mix64};
use futures::StreamExt;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::csv_time;
use crate::error::{DataError, Result};
use crate::widen;

/// The synthetic data of the generator source.
#[derive(Debug, Clone)]
pub struct GeneratorSpec {
    /// Rows over all ranks.
    pub rows: u64,
    /// Distinct keys.
    pub keys: u64,
    /// `ts` is drawn uniformly from `0..span` (unsorted).
    pub span: i64,
    /// Seed.
    pub seed: u64,
    /// Fraction of null values in `v`.
    pub null_fraction: f64,
    /// Store `ts` as `timestamp[us]` instead of int64.
    pub timestamp: bool,
}

impl GeneratorSpec {
    /// The generated schema: `id` int64, `ts` int64 or `timestamp[us]`, `key`
    /// int64, `v` float64 (nullable).
    pub fn schema(&self) -> SchemaRef {
        let ts = if self.timestamp {
            DataType::Timestamp(TimeUnit::Microsecond, None)
        } else {
            DataType::Int64
        };
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("ts", ts, false),
            Field::new("key", DataType::Int64, false),
            Field::new("v", DataType::Float64, true),
        ]))
    }

    /// Rows `lo..hi` of the generated table.
    pub fn batch(&self, lo: u64, hi: u64) -> Result<RecordBatch> {
        let mix = |x: u64| mix64(x.wrapping_add(self.seed.wrapping_mul(GOLDEN)));
        let n = (hi - lo) as usize;
        let mut id = Vec::with_capacity(n);
        let mut ts = Vec::with_capacity(n);
        let mut key = Vec::with_capacity(n);
        let mut v = Vec::with_capacity(n);
        let span = self.span.max(1) as u64;
        let keys = self.keys.max(1);
        let null_cut = (self.null_fraction.clamp(0.0, 1.0) * 1_000_000.0) as u64;
        for i in lo..hi {
            let h = mix(i);
            let h2 = mix(h ^ 0x5555);
            id.push(i as i64);
            ts.push((h % span) as i64);
            key.push(((h >> 20) % keys) as i64);
            v.push(if (h2 % 1_000_000) < null_cut {
                None
            } else {
                Some(((h2 >> 11) as f64 / (1u64 << 53) as f64) * 200.0 - 100.0)
            });
        }
        let ts: ArrayRef = if self.timestamp {
            Arc::new(TimestampMicrosecondArray::from(ts))
        } else {
            Arc::new(Int64Array::from(ts))
        };
        Ok(RecordBatch::try_new(
            self.schema(),
            vec![
                Arc::new(Int64Array::from(id)),
                ts,
                Arc::new(Int64Array::from(key)),
                Arc::new(Float64Array::from(v)),
            ],
        )?)
    }
}

/// Where a table comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A Parquet file, or a directory of them.
    Parquet(PathBuf),
    /// A CSV file (with a header), or a directory of them.
    Csv(PathBuf),
    /// Batches this rank holds.
    Memory(SchemaRef, Vec<RecordBatch>),
    /// Synthetic data.
    Generator(GeneratorSpec),
}

/// Whether `path` ends in `.ext`, in any letter case (`DATA.CSV` is CSV).
pub fn has_extension(path: &Path, ext: &str) -> bool {
    path.extension()
        .is_some_and(|x| x.to_str().is_some_and(|x| x.eq_ignore_ascii_case(ext)))
}

/// A data file's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataFormat {
    /// Parquet.
    Parquet,
    /// CSV with a header line (`.csv`, `.tsv`; gzip-compressed as
    /// `.csv.gz`, `.tsv.gz`).
    Csv,
}

impl DataFormat {
    /// The format a file's name says, in any letter case: `.csv`, `.tsv`,
    /// `.csv.gz` and `.tsv.gz` are CSV; `.parquet`, `.parq` and `.pq` are Parquet; other
    /// names say nothing.
    pub fn of_name(path: &Path) -> Option<DataFormat> {
        if has_extension(path, "csv") || has_extension(path, "tsv") || gz_csv(path) {
            Some(DataFormat::Csv)
        } else if ["parquet", "parq", "pq"]
            .iter()
            .any(|x| has_extension(path, x))
        {
            Some(DataFormat::Parquet)
        } else {
            None
        }
    }

    fn name(self) -> &'static str {
        match self {
            DataFormat::Parquet => "Parquet",
            DataFormat::Csv => "CSV",
        }
    }
}

/// Whether `path` names a gzip-compressed CSV file (`.csv.gz`, `.tsv.gz`).
fn gz_csv(path: &Path) -> bool {
    has_extension(path, "gz")
        && path.file_stem().is_some_and(|s| {
            has_extension(Path::new(s), "csv") || has_extension(Path::new(s), "tsv")
        })
}

/// A CSV file's field delimiter, found as DuckDB's sniffer finds it: of
/// `,` `;` tab and `|`, the one its header line holds most often outside
/// quotes (`,` where none appears, or on a tie with it).
pub(crate) fn csv_delimiter(path: &Path) -> Result<u8> {
    use std::io::{BufRead, Read};
    let mut line = Vec::new();
    std::io::BufReader::new(open_csv(path)?)
        .take(1 << 20)
        .read_until(b'\n', &mut line)
        .map_err(|e| DataError::file(path, e))?;
    let mut counts = [0usize; 4];
    let mut quoted = false;
    for &c in &line {
        match c {
            b'"' => quoted = !quoted,
            _ if quoted => {}
            _ => {
                if let Some(k) = CSV_DELIMITERS.iter().position(|&d| d == c) {
                    counts[k] += 1;
                }
            }
        }
    }
    // The first of the most frequent: `,` wins its ties.
    let best = (0..4).fold(0, |b, k| if counts[k] > counts[b] { k } else { b });
    Ok(CSV_DELIMITERS[best])
}

/// The field delimiters a CSV input may use, `,` first.
const CSV_DELIMITERS: [u8; 4] = [b',', b';', b'\t', b'|'];

/// A CSV file's bytes, decompressed where it is a `.csv.gz` (several gzip
/// members, as `cat a.gz b.gz` makes, read as one stream).
pub(crate) fn open_csv(path: &Path) -> Result<Box<dyn std::io::Read + Send>> {
    let f = File::open(path).map_err(|e| DataError::file(path, e))?;
    Ok(if gz_csv(path) {
        Box::new(flate2::read::MultiGzDecoder::new(f))
    } else {
        Box::new(f)
    })
}

/// Whether a CSV file holds nothing (no header, no rows): empty, or, for
/// a gzip-compressed one, empty once decompressed. A file that cannot be
/// read counts as not empty: its read says why.
fn csv_empty(path: &Path) -> bool {
    if std::fs::metadata(path).is_ok_and(|m| m.len() == 0) {
        return true;
    }
    gz_csv(path)
        && open_csv(path)
            .is_ok_and(|mut r| matches!(std::io::Read::read(&mut r, &mut [0u8; 1]), Ok(0)))
}

/// Why an input that is neither a regular file nor a directory is refused.
const NOT_REGULAR: &str = "not a regular file or directory (a pipe, socket or device): inputs are read more than once (the schema, then the rows), so give the data as a file";

/// Files and directories that are not data, as Spark, Hive, Dask and
/// pyarrow agree: names that start with `.` or `_` (`_SUCCESS`, `.crc`
/// checksums, `_metadata`, `_temporary`, braid's own staging).
fn not_data(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with('.') || n.starts_with('_'))
}

/// Whether the file starts with Parquet's magic bytes.
fn starts_par1(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && magic == *b"PAR1"
}

/// A data file's format: its name's, else Parquet where it starts with
/// Parquet's magic (Hive's and Hadoop's part files have no extension).
fn format_of(path: &Path) -> Option<DataFormat> {
    DataFormat::of_name(path).or_else(|| starts_par1(path).then_some(DataFormat::Parquet))
}

impl Source {
    /// The source that reads `path`: a file is CSV when its name says so
    /// ([`DataFormat::of_name`]), else Parquet (its footer says if it is not); a
    /// directory is CSV when it holds CSV files (files: a subdirectory
    /// named `x.csv`, say a job's earlier output, is not one), else
    /// Parquet (reading then checks that its files are all of one
    /// format).
    pub fn at(path: PathBuf) -> Source {
        let csv = match path.is_dir() {
            false => DataFormat::of_name(&path) == Some(DataFormat::Csv),
            true => std::fs::read_dir(&path).is_ok_and(|rd| {
                rd.flatten().any(|e| {
                    let p = e.path();
                    !not_data(&p) && DataFormat::of_name(&p) == Some(DataFormat::Csv) && !p.is_dir()
                })
            }),
        };
        match csv {
            true => Source::Csv(path),
            false => Source::Parquet(path),
        }
    }
}

/// The files a source reads at `path`: the file itself, or every file
/// directly in the directory, sorted by name, except those whose names
/// start with `.` or `_` ([`not_data`]) and empty CSV files (no header, no
/// rows, as DuckDB and Polars skip them). A directory is read whole or
/// refused: a file of the other format, a file of neither format, or a
/// subdirectory with data files (Hive-style partitions, say) is an error,
/// as those rows would otherwise be missing without a word.
fn files_with(path: &Path, format: DataFormat) -> Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(path).map_err(|e| DataError::file(path, e))?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    if !meta.is_dir() {
        return Err(DataError::file(path, NOT_REGULAR));
    }
    let entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| DataError::file(path, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| !not_data(p))
        .collect();
    let mut files = Vec::new();
    for p in entries {
        if p.is_dir() {
            if let Some(inner) = data_file_below(&p, 8) {
                return Err(DataError::file(
                    path,
                    format!(
                        "{} lies in a subdirectory, and only the files directly in the directory are read (Hive-style partitions are not): give each directory, or move the files up",
                        inner.display()
                    ),
                ));
            }
            continue;
        }
        // A pipe, socket or device: never opened (opening a pipe waits
        // for a writer), refused (its rows would be missing).
        if !p.is_file() {
            return Err(DataError::file(&p, NOT_REGULAR));
        }
        match format_of(&p) {
            Some(f) if f == format => {
                if !(format == DataFormat::Csv && csv_empty(&p)) {
                    files.push(p);
                }
            }
            Some(other) => {
                return Err(DataError::file(
                    path,
                    format!(
                        "the directory holds both {} and {} files ({}): give one format",
                        format.name(),
                        other.name(),
                        p.display()
                    ),
                ));
            }
            None => {
                // A file that cannot be read says so, rather than be
                // taken for one of neither format.
                File::open(&p).map_err(|e| DataError::file(&p, e))?;
                return Err(DataError::file(
                    path,
                    format!(
                        "{} is neither a CSV file (.csv or .tsv, or gzip-compressed .csv.gz or .tsv.gz) nor a Parquet file, and every file in an input directory is read (names that start with . or _ are skipped): move it out or rename it",
                        p.display()
                    ),
                ));
            }
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(DataError::file(
            path,
            format!(
                "directory has no {} files (data files: .parquet, .parq, .pq or Parquet by content; .csv, .tsv, .csv.gz or .tsv.gz)",
                format.name()
            ),
        ));
    }
    Ok(files)
}

/// A data file (by its name or content) in `dir` or below it (at most
/// `depth` levels down), if any; names that are not data are skipped.
fn data_file_below(dir: &Path, depth: u32) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    for p in entries.filter_map(|e| e.ok().map(|e| e.path())) {
        if not_data(&p) {
            continue;
        }
        if p.is_file() && format_of(&p).is_some() {
            return Some(p);
        }
        if depth > 0 && p.is_dir() {
            if let Some(f) = data_file_below(&p, depth - 1) {
                return Some(f);
            }
        }
    }
    None
}

fn parquet_builder(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<File>> {
    let meta = parquet_meta(path)?;
    let f = File::open(path).map_err(|e| DataError::file(path, e))?;
    Ok(ParquetRecordBatchReaderBuilder::new_with_metadata(f, meta))
}

/// The file's footer as the reader takes it (the schema hints of
/// [`parquet_builder`]), read once and shared by every piece of the file
/// read: a footer re-read per row group cost O(row groups) each, and a
/// file of 8000 one-row groups took 57 s to read.
fn parquet_meta(path: &Path) -> Result<parquet::arrow::arrow_reader::ArrowReaderMetadata> {
    use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
    let f = File::open(path).map_err(|e| DataError::file(path, e))?;
    let meta = ArrowReaderMetadata::load(&f, ArrowReaderOptions::new()).map_err(|e| {
        // Say what a file that is not Parquet at all is taken for.
        if starts_par1(path) {
            DataError::file(path, e)
        } else {
            DataError::file(
                path,
                "not a Parquet file (it does not start with PAR1): inputs are read by name, .csv, .tsv, .csv.gz and .tsv.gz as CSV and anything else as Parquet (decompress a CSV compressed otherwise first)",
            )
        }
    })?;
    let zoned = zones_kept(&meta);
    let meta = match (
        readable(zoned.clone().unwrap_or_else(|| meta.schema().clone())),
        zoned,
    ) {
        ((schema, true), _) | ((schema, false), Some(_)) => ArrowReaderMetadata::try_new(
            meta.metadata().clone(),
            ArrowReaderOptions::new().with_schema(schema),
        )
        .map_err(|e| DataError::file(path, e))?,
        ((_, false), None) => meta,
    };
    Ok(meta)
}

/// `schema` with the dictionary types the Parquet reader cannot build
/// replaced by their value types (and whether any was): pyarrow keeps a
/// `dictionary<int32, decimal128>` column's type in the file's Arrow
/// schema, and the reader, taking it as its hint, failed the whole file
/// ("unsupported data type for byte array dictionary reader"). The
/// reader builds dictionaries of strings, binaries and the other
/// primitive types.
fn readable(schema: SchemaRef) -> (SchemaRef, bool) {
    let builds = |v: &DataType| {
        matches!(
            v,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary | DataType::LargeBinary
        ) || (v.is_primitive()
            && !matches!(
                v,
                DataType::Decimal32(..)
                    | DataType::Decimal64(..)
                    | DataType::Decimal128(..)
                    | DataType::Decimal256(..)
            ))
    };
    let mut changed = false;
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Dictionary(_, v) if !builds(v) => {
                changed = true;
                f.as_ref().clone().with_data_type(v.as_ref().clone())
            }
            _ => f.as_ref().clone(),
        })
        .collect();
    match changed {
        true => (
            Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())),
            true,
        ),
        false => (schema, false),
    }
}

/// The file's schema with the time zones its writer recorded put back,
/// where the reader dropped them; `None` when it dropped none.
///
/// Parquet has no timestamp unit of seconds: pyarrow (and braid's sink)
/// store such a column in milliseconds, adjusted to UTC, and keep the
/// column's Arrow type, zone included, in the file's `ARROW:schema`
/// metadata. The Parquet reader takes that type only where the units
/// agree, so a `timestamp[s, tz=America/New_York]` column came back as
/// milliseconds in UTC, and calendar windows (`1d`) were counted on UTC's
/// clock instead of New York's. The values are the same instants either
/// way: only the zone is put back (the unit stays milliseconds, as
/// pyarrow reads it).
fn zones_kept(meta: &parquet::arrow::arrow_reader::ArrowReaderMetadata) -> Option<SchemaRef> {
    use base64::Engine;
    let kv = meta.metadata().file_metadata().key_value_metadata()?;
    let encoded = kv
        .iter()
        .find(|e| e.key == parquet::arrow::ARROW_SCHEMA_META_KEY)?
        .value
        .as_ref()?;
    let bytes = base64::prelude::BASE64_STANDARD.decode(encoded).ok()?;
    // An IPC message, after a continuation marker and length where present.
    let msg = match bytes.get(..4) {
        Some([255, 255, 255, 255]) => bytes.get(8..)?,
        _ => &bytes[..],
    };
    let written = arrow_ipc::convert::try_fb_to_schema(
        arrow_ipc::root_as_message(msg).ok()?.header_as_schema()?,
    )
    .ok()?;
    let schema = meta.schema();
    let mut changed = false;
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let zone = written
                .field_with_name(f.name())
                .ok()
                .and_then(|w| match w.data_type() {
                    DataType::Timestamp(_, Some(z)) => Some(z.clone()),
                    _ => None,
                });
            match (f.data_type(), zone) {
                (DataType::Timestamp(unit, Some(have)), Some(z)) if *have != z => {
                    changed = true;
                    f.as_ref()
                        .clone()
                        .with_data_type(DataType::Timestamp(*unit, Some(z)))
                }
                _ => f.as_ref().clone(),
            }
        })
        .collect();
    changed.then(|| Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())))
}

/// A unit of a Parquet input that one rank reads: rows `start..start +
/// len` of one row group, or several whole row groups (small ones put
/// together, `start` 0 and `len` their rows).
struct ParquetPiece {
    file: PathBuf,
    meta: parquet::arrow::arrow_reader::ArrowReaderMetadata,
    groups: Vec<usize>,
    start: usize,
    len: usize,
}

/// A piece's rows, in chunks of at most `chunk_rows` rows.
fn read_parquet_piece(p: &ParquetPiece, chunk_rows: usize) -> Result<Vec<RecordBatch>> {
    use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
    let f = &p.file;
    let file = File::open(f).map_err(|e| DataError::file(f, e))?;
    let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, p.meta.clone());
    let days_ms = DataType::Interval(arrow_schema::IntervalUnit::DayTime);
    let intervals = builder
        .schema()
        .fields()
        .iter()
        .any(|x| x.data_type() == &days_ms);
    let mut builder = builder
        .with_row_groups(p.groups.clone())
        // The reader sizes its buffers for a whole batch up front; smaller
        // chunks are allowed ("at most").
        .with_batch_size(chunk_rows.min(READ_BATCH_ROWS));
    if let [_] = p.groups[..] {
        builder = builder.with_row_selection(RowSelection::from(vec![
            RowSelector::skip(p.start),
            RowSelector::select(p.len),
        ]));
    }
    let reader = builder.build().map_err(|e| DataError::file(f, e))?;
    let batches = reader
        .map(|b| b.map_err(|e| DataError::file(f, e)))
        .collect::<Result<Vec<_>>>()?;
    if intervals {
        match p.groups[..] {
            [g] => check_interval_months(f, &p.meta, g, p.start, p.len)?,
            _ => {
                for &g in &p.groups {
                    let rows = p.meta.metadata().row_group(g).num_rows().max(0) as usize;
                    check_interval_months(f, &p.meta, g, 0, rows)?;
                }
            }
        }
    }
    Ok(batches)
}

/// Fails if a Parquet INTERVAL column among rows `start..start + len` of
/// row group `g` holds months. An INTERVAL is three numbers (months,
/// days, milliseconds); arrow-rs reads it as days and milliseconds only
/// (it has no reader for Arrow's month-day-nano intervals, nor a writer),
/// so the job would carry `1 month 2 days` on as `2 days` without a word.
/// The months are read here as a second, hinted read of those columns
/// alone (called only for files with such columns).
fn check_interval_months(
    f: &Path,
    footer: &parquet::arrow::arrow_reader::ArrowReaderMetadata,
    g: usize,
    start: usize,
    len: usize,
) -> Result<()> {
    use arrow_array::{Array, IntervalYearMonthArray};
    use arrow_schema::IntervalUnit;
    use parquet::arrow::ProjectionMask;
    use parquet::arrow::arrow_reader::{
        ArrowReaderMetadata, ArrowReaderOptions, RowSelection, RowSelector,
    };
    let schema = footer.schema().clone();
    let days_ms = DataType::Interval(IntervalUnit::DayTime);
    let intervals: Vec<usize> = (0..schema.fields().len())
        .filter(|&i| schema.field(i).data_type() == &days_ms)
        .collect();
    if intervals.is_empty() {
        return Ok(());
    }
    let hinted = Schema::new_with_metadata(
        schema
            .fields()
            .iter()
            .map(|x| match x.data_type() == &days_ms {
                true => x
                    .as_ref()
                    .clone()
                    .with_data_type(DataType::Interval(IntervalUnit::YearMonth)),
                false => x.as_ref().clone(),
            })
            .collect::<Vec<_>>(),
        schema.metadata().clone(),
    );
    let meta = ArrowReaderMetadata::try_new(
        footer.metadata().clone(),
        ArrowReaderOptions::new().with_schema(Arc::new(hinted)),
    )
    .map_err(|e| DataError::file(f, e))?;
    let mask = ProjectionMask::roots(meta.parquet_schema(), intervals.iter().copied());
    let file = File::open(f).map_err(|e| DataError::file(f, e))?;
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta)
        .with_projection(mask)
        .with_row_groups(vec![g])
        .with_row_selection(RowSelection::from(vec![
            RowSelector::skip(start),
            RowSelector::select(len),
        ]))
        .with_batch_size(READ_BATCH_ROWS.min(len.max(1)))
        .build()
        .map_err(|e| DataError::file(f, e))?;
    let mut row = start;
    for b in reader {
        let b = b.map_err(|e| DataError::file(f, e))?;
        for (c, &i) in intervals.iter().enumerate() {
            let months = b
                .column(c)
                .as_any()
                .downcast_ref::<IntervalYearMonthArray>()
                .and_then(|m| (0..m.len()).find(|&k| m.is_valid(k) && m.value(k) != 0));
            if let Some(k) = months {
                return Err(DataError::file(
                    f,
                    format!(
                        "column \"{}\" is a Parquet INTERVAL that holds months (row {} of row group {g}): braid's Parquet reader keeps only an interval's days and milliseconds, so the column would be carried on wrong; drop it from the input or cast it (to text, or to its parts) before the job",
                        schema.field(i).name(),
                        row + k
                    ),
                ));
            }
        }
        row += b.num_rows();
    }
    Ok(())
}

/// How many bytes of row groups, by their footers' uncompressed sizes, a
/// rank's Parquet source reads ahead of what it has sent: 256 MiB. An
/// estimate of the decoded size: plain numeric columns decode to about
/// their footer size (10M rows of 5 numeric columns in row groups of 1M
/// rows: 27 MiB a group by the footer, ~40 MiB decoded), dictionary-encoded
/// ones (few distinct strings) to several times it.
const READ_AHEAD_BYTES: u64 = 256 << 20;

/// The most rows a file reader puts in one chunk: readers reserve a
/// chunk's buffers before reading (the CSV reader about 128 bytes a row),
/// so the largest `chunk_rows` would take gigabytes for a two-line file.
const READ_BATCH_ROWS: usize = 1 << 20;

/// A CSV reader's error on `path`, a value that does not parse as its
/// column's type said in the file's terms: the column by name and the
/// file's line (the reader counts records from 0 at the header, which
/// [`csv_time::record_line`] turns into the line, and names columns by
/// index); other errors as they are.
fn csv_error(path: &Path, schema: &SchemaRef, e: arrow_schema::ArrowError) -> DataError {
    let arrow_schema::ArrowError::ParseError(msg) = &e else {
        return DataError::file(path, e);
    };
    let parsed = (|| {
        let rest = msg.strip_prefix("Error while parsing value '")?;
        let (value, rest) = rest.rsplit_once("' for column ")?;
        let (value, ty) = value.rsplit_once("' as type '")?;
        let (col, rest) = rest.split_once(" at line ")?;
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let record: usize = rest[..digits].parse().ok()?;
        let name = schema.fields().get(col.parse::<usize>().ok()?)?.name();
        Some(format!(
            "line {}: value '{value}' of column \"{name}\" is not {ty}, the type inferred from the file's first 10,000 rows (give such data as Parquet, or with a value of the wider type in those rows)",
            csv_time::record_line(path, record)
        ))
    })();
    match parsed {
        Some(detail) => DataError::file(path, detail),
        None => DataError::file(path, e),
    }
}

/// Rows of a CSV file its column types are inferred from.
const CSV_SAMPLE_ROWS: usize = 10_000;

/// A CSV file's schema, inferred from its first rows: Arrow's inference,
/// then dates and timestamps as [`csv_time`] finds them in the same rows
/// read as text (a timestamp in microseconds, or nanoseconds where a
/// fraction has more digits; minutes without seconds too).
fn csv_schema(path: &Path) -> Result<Schema> {
    let open = || open_csv(path);
    let delimiter = csv_delimiter(path)?;
    let (schema, _) = arrow_csv::reader::Format::default()
        .with_header(true)
        .with_delimiter(delimiter)
        .infer_schema(open()?, Some(CSV_SAMPLE_ROWS))
        .map_err(|e| DataError::file(path, e))?;
    // An empty file has no header: refused, rather than read as a table
    // with no columns (which the job would report as a missing column).
    if schema.fields().is_empty() {
        return Err(DataError::file(
            path,
            "the CSV file is empty (a CSV input starts with a header line)",
        ));
    }
    // Columns whose sampled text decides their type: dates, timestamps
    // and text (see `csv_time`), and floats (integers past i64's range).
    let sampled = |t: &DataType| {
        matches!(
            t,
            DataType::Date32 | DataType::Timestamp(..) | DataType::Utf8 | DataType::Float64
        )
    };
    if !schema.fields().iter().any(|f| sampled(f.data_type())) {
        return Ok(schema);
    }
    let sample = csv_sample(path, &schema, delimiter)?;
    let fields = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let t = f.data_type();
            let values = sample
                .as_ref()
                .filter(|_| sampled(t))
                .and_then(|b| b.column(i).as_any().downcast_ref::<StringArray>());
            let found = values
                .filter(|_| *t != DataType::Float64)
                .and_then(csv_time::infer);
            let wide = values
                .filter(|_| matches!(t, DataType::Utf8 | DataType::Float64))
                .and_then(wide_integers);
            let t = match (found.or(wide), t) {
                // Dates or timestamps (`csv_time`), or integers some of
                // which are past i64's range, which Arrow takes for floats
                // or text (as floats, distinct ones would become equal).
                (Some(found), _) => found,
                // Arrow's pattern took the column for dates or timestamps,
                // but a sampled value is none (`0000-00-00`, `2024-02-30`,
                // a date and then words): text, as DuckDB and Polars read
                // it, so that a column the job does not use cannot fail it.
                (None, DataType::Date32 | DataType::Timestamp(..)) => DataType::Utf8,
                // Floats spelled as Arrow's pattern does not know them
                // (`nan`, `Infinity`, `-INF`: DuckDB reads them as
                // doubles), among numbers: a float column, not text. (Its
                // reader parses these spellings.)
                (None, DataType::Utf8) if values.is_some_and(all_floats) => DataType::Float64,
                (None, t) => t.clone(),
            };
            f.as_ref().clone().with_data_type(t)
        })
        .collect::<Vec<_>>();
    Ok(Schema::new(fields))
}

/// The first [`CSV_SAMPLE_ROWS`] rows of a CSV file whose inferred schema
/// is `schema`, every column read as text (`None` for a header-only file).
fn csv_sample(path: &Path, schema: &Schema, delimiter: u8) -> Result<Option<RecordBatch>> {
    let text = Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| Field::new(f.name(), DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ));
    arrow_csv::ReaderBuilder::new(text)
        .with_header(true)
        .with_delimiter(delimiter)
        .with_batch_size(CSV_SAMPLE_ROWS)
        .build(open_csv(path)?)
        .map_err(|e| DataError::file(path, e))?
        .next()
        .transpose()
        .map_err(|e| DataError::file(path, e))
}

/// The type of a sampled column whose values are all integers (digits,
/// an optional sign) and some past i64's range: u64 where they all fit
/// it, else text (DuckDB and Polars read them as 128-bit integers).
/// Arrow infers such a column as floats (or text, past 19 digits), which
/// keep only 15-17 digits: ids or keys that differ past those would
/// become equal. `None` for any other column.
fn wide_integers(values: &StringArray) -> Option<DataType> {
    let integer = |v: &str| {
        let d = v.strip_prefix(['+', '-']).unwrap_or(v);
        !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit())
    };
    let mut wide = false;
    let mut unsigned = true;
    for v in values.iter().flatten() {
        let v = v.trim();
        if !integer(v) {
            return None;
        }
        wide |= v.parse::<i64>().is_err();
        unsigned &= v.parse::<u64>().is_ok();
    }
    match (wide, unsigned) {
        (false, _) => None,
        (true, true) => Some(DataType::UInt64),
        (true, false) => Some(DataType::Utf8),
    }
}

/// Whether a sampled text column holds only numbers, some of them spelled
/// as Arrow's inference does not take a float (`nan`, `Infinity`, `+inf`
/// in any letter case), and at least one value.
fn all_floats(values: &StringArray) -> bool {
    values.iter().flatten().next().is_some()
        && values.iter().flatten().all(|v| {
            let special = v.trim_start_matches(['+', '-']);
            ["nan", "inf", "infinity"]
                .iter()
                .any(|s| special.eq_ignore_ascii_case(s))
                || (v.bytes().any(|c| c.is_ascii_digit()) && v.parse::<f64>().is_ok())
        })
}

/// The schema of CSV files read as one table: every file's header must
/// name the same columns in the same order (columns are read by
/// position, so a different order would swap data). A column's type is
/// the widest any file suggests: all-empty columns take the others' type
/// (or i64 where every file's is empty, so that a header-only input, which
/// has nothing to infer from, still has an integer order column and gives
/// an empty result), integers and floats give f64, anything else that
/// disagrees is read as text.
fn csv_table_schema(files: &[PathBuf]) -> Result<SchemaRef> {
    let mut merged: Option<(Vec<String>, Vec<DataType>)> = None;
    for f in files {
        let s = csv_schema(f)?;
        let names: Vec<String> = s.fields().iter().map(|x| x.name().clone()).collect();
        let types: Vec<DataType> = s.fields().iter().map(|x| x.data_type().clone()).collect();
        match &mut merged {
            None => merged = Some((names, types)),
            Some((first, acc)) => {
                if *first != names {
                    return Err(DataError::file(
                        f,
                        format!(
                            "its header ({}) differs from the first file's ({})",
                            names.join(","),
                            first.join(",")
                        ),
                    ));
                }
                // Types that differ take their common type (integers and
                // floats give f64; timestamps the finer unit, in UTC
                // where a file's are; dates in one file and timestamps in
                // another are timestamps, as DuckDB reads them), text
                // where there is none.
                for (a, t) in acc.iter_mut().zip(types) {
                    *a = csv_time::common_type(a, &t)
                        .or_else(|| widen::common_type(a, &t))
                        .unwrap_or(DataType::Utf8);
                }
            }
        }
    }
    let (names, types) = merged.unwrap_or_default();
    Ok(Arc::new(Schema::new(
        names
            .into_iter()
            .zip(types)
            .map(|(n, t)| {
                let t = if t == DataType::Null {
                    DataType::Int64
                } else {
                    t
                };
                Field::new(n, t, true)
            })
            .collect::<Vec<_>>(),
    )))
}

/// The schema of Parquet files read as one table: every file must have
/// the same columns, by name (in any order; the first file's order is the
/// table's), and each column takes the common type of its files' types
/// (`widen::common_type`: `int32` and `int64` read as `int64`, `string`
/// and `large_string` and dictionaries of strings as one string type, as
/// DuckDB reads them); a column is nullable where any file's is (writers
/// differ in what they declare: pyarrow keeps a table's non-nullable
/// fields, Polars declares every field nullable). A file whose column
/// names repeat is matched by position.
fn parquet_table_schema(files: &[PathBuf]) -> Result<SchemaRef> {
    let Some((first_file, rest)) = files.split_first() else {
        return Err(DataError::Invalid("no Parquet files".into()));
    };
    let first = parquet_builder(first_file)?.schema().clone();
    let mut fields: Vec<Field> = first.fields().iter().map(|f| f.as_ref().clone()).collect();
    let names =
        |s: &Schema| -> Vec<String> { s.fields().iter().map(|x| x.name().clone()).collect() };
    let by_name = unique_names(&first);
    for f in rest {
        let s = parquet_builder(f)?.schema().clone();
        let (mut mine, mut theirs) = (names(&first), names(&s));
        if by_name {
            mine.sort();
            theirs.sort();
        }
        if mine != theirs {
            return Err(DataError::file(
                f,
                format!(
                    "its columns ({}) differ from the first file's ({})",
                    names(&s).join(","),
                    names(&first).join(",")
                ),
            ));
        }
        for (k, acc) in fields.iter_mut().enumerate() {
            let x = column_of(&s, k, acc.name())
                .map(|j| s.field(j))
                .ok_or_else(|| DataError::file(f, format!("no column {:?}", acc.name())))?;
            if acc.data_type() != x.data_type() {
                let t = widen::common_type(acc.data_type(), x.data_type()).ok_or_else(|| {
                    DataError::file(
                        f,
                        format!(
                            "column {:?} is {} here, {} in the first file (no type holds both)",
                            x.name(),
                            x.data_type(),
                            acc.data_type()
                        ),
                    )
                })?;
                acc.set_data_type(t);
            }
            if x.is_nullable() {
                acc.set_nullable(true);
            }
        }
    }
    // A dictionary of numbers, dates or timestamps (pandas' categoricals of
    // them, say) is its values stored another way: the table holds the
    // values, as DuckDB and Polars read them, so that such a column can
    // be the order column or a value column. Dictionaries of strings and
    // bytes stay.
    for f in &mut fields {
        if let DataType::Dictionary(_, v) = f.data_type() {
            if !matches!(
                v.as_ref(),
                DataType::Utf8
                    | DataType::LargeUtf8
                    | DataType::Utf8View
                    | DataType::Binary
                    | DataType::LargeBinary
                    | DataType::BinaryView
            ) {
                let v = v.as_ref().clone();
                f.set_data_type(v);
            }
        }
    }
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        first.metadata().clone(),
    )))
}

/// Whether no two columns of `s` share a name (then files are matched by
/// name).
fn unique_names(s: &Schema) -> bool {
    let mut seen = std::collections::HashSet::new();
    s.fields().iter().all(|f| seen.insert(f.name()))
}

/// The position in `s` of the table's column `k`, named `name`: the same
/// position where the name is there (always so for names that repeat),
/// else the column of that name.
fn column_of(s: &Schema, k: usize, name: &str) -> Option<usize> {
    match s.fields().get(k) {
        Some(f) if f.name() == name => Some(k),
        _ => s.index_of(name).ok(),
    }
}

/// `b`, read from `file`, under the table's schema: its columns in the
/// table's order, each cast to the table's type where the file's differs
/// (exactly: a value the type cannot hold, such as a timestamp beyond the
/// finer unit's range, is an error, not a null), declared nullable where
/// another file's is.
fn as_table(b: RecordBatch, table: &SchemaRef, file: &Path) -> Result<RecordBatch> {
    if b.schema().fields() == table.fields() {
        return Ok(b);
    }
    let exact = arrow_cast::CastOptions {
        safe: false,
        ..Default::default()
    };
    let schema = b.schema();
    let cols = table
        .fields()
        .iter()
        .enumerate()
        .map(|(k, f)| {
            let c = column_of(&schema, k, f.name())
                .map(|j| b.column(j))
                .ok_or_else(|| DataError::file(file, format!("no column {:?}", f.name())))?;
            if c.data_type() == f.data_type() {
                return Ok(c.clone());
            }
            arrow_cast::cast_with_options(c, f.data_type(), &exact).map_err(|e| {
                DataError::file(
                    file,
                    format!(
                        "column {:?}: {} read as the table's {}: {e}",
                        f.name(),
                        c.data_type(),
                        f.data_type()
                    ),
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    RecordBatch::try_new(table.clone(), cols).map_err(|e| {
        DataError::file(
            file,
            format!("a batch does not fit the table's schema: {e}"),
        )
    })
}

/// The first value of `column` in the sampled rows of CSV file `path`
/// (its schema `schema`) that is neither a number nor a date or
/// date-time, as a note on why the column is text (a number with spaces
/// around it says so: nothing in the value itself looks wrong).
fn text_example(path: &Path, schema: &Schema, column: &str) -> Option<String> {
    let i = schema.index_of(column).ok()?;
    let sample = csv_sample(path, schema, csv_delimiter(path).ok()?).ok()??;
    let values = sample.column(i).as_any().downcast_ref::<StringArray>()?;
    let typed = |v: &str| {
        v.parse::<f64>().is_ok() || csv_time::infer(&StringArray::from(vec![v])).is_some()
    };
    let v = values.iter().flatten().find(|v| !typed(v))?;
    // (Arrow's reader, as Polars', takes ` 2.5` for text: the spaces are
    // the field's; DuckDB's trims them.)
    Some(if v.trim() != v && typed(v.trim()) {
        format!("such as {v:?}: a number or date with spaces around it is text")
    } else {
        format!("such as {v:?}, neither a number nor a date")
    })
}

/// Why the CSV files' column `column` reads as text, for an error that
/// refuses it: the first file whose rows make it text, or the first two
/// whose types have no common one. `None` where neither is found.
fn csv_text_note(files: &[PathBuf], column: &str) -> Option<String> {
    let mut seen: Option<(&PathBuf, DataType)> = None;
    for f in files {
        let schema = csv_schema(f).ok()?;
        let t = schema.field_with_name(column).ok()?.data_type().clone();
        if t == DataType::Utf8 {
            let example = text_example(f, &schema, column)
                .map(|v| format!(" ({v})"))
                .unwrap_or_default();
            return Some(format!(
                "{} holds text in it{example}, within its first {CSV_SAMPLE_ROWS} rows",
                f.display()
            ));
        }
        match &mut seen {
            Some((g, u)) => match widen::common_type(u, &t) {
                Some(c) => *u = c,
                None => {
                    return Some(format!(
                        "{} reads it as {t}, {} as {u}: no type holds both",
                        f.display(),
                        g.display()
                    ));
                }
            },
            None if t != DataType::Null => seen = Some((f, t)),
            None => {}
        }
    }
    None
}

impl Source {
    /// `err` with, where it refuses a CSV input's column that reads as
    /// text, which file makes it text: in a directory of many files the
    /// type alone does not say where to look.
    pub fn explain(&self, err: DataError) -> DataError {
        let (
            Source::Csv(p),
            DataError::WrongType {
                name,
                found,
                expected,
            },
        ) = (self, &err)
        else {
            return err;
        };
        if *found != DataType::Utf8.to_string() {
            return err;
        }
        let note = files_with(p, DataFormat::Csv)
            .ok()
            .and_then(|files| csv_text_note(&files, name));
        match note {
            Some(note) => DataError::WrongType {
                name: name.clone(),
                found: format!("{found} ({note})"),
                expected: expected.clone(),
            },
            None => err,
        }
    }

    /// The table's schema (every rank gets the same answer).
    pub fn schema(&self) -> Result<SchemaRef> {
        match self {
            Source::Parquet(p) => parquet_table_schema(&files_with(p, DataFormat::Parquet)?),
            Source::Csv(p) => csv_table_schema(&files_with(p, DataFormat::Csv)?),
            Source::Memory(s, _) => Ok(s.clone()),
            Source::Generator(g) => Ok(g.schema()),
        }
    }

    /// The table's rows where known before reading it: a Parquet table's
    /// by its footers, held or generated rows; `None` for CSV (known only
    /// once read). For progress reports.
    pub fn known_rows(&self) -> Result<Option<u64>> {
        Ok(match self {
            Source::Parquet(p) => {
                let mut rows = 0u64;
                for f in files_with(p, DataFormat::Parquet)? {
                    let n = parquet_builder(&f)?.metadata().file_metadata().num_rows();
                    rows = rows.saturating_add(n.max(0) as u64);
                }
                Some(rows)
            }
            Source::Csv(_) => None,
            Source::Memory(_, batches) => Some(batches.iter().map(|b| b.num_rows() as u64).sum()),
            Source::Generator(g) => Some(g.rows),
        })
    }

    /// Reads this rank's share and sends it downstream in chunks of at most
    /// `chunk_rows` rows; `progress` counts the rows read.
    pub async fn run(
        self,
        ctx: Context,
        chunk_rows: usize,
        mut out: Sender,
        progress: Option<Arc<std::sync::atomic::AtomicU64>>,
    ) -> Result<(), NodeError> {
        let (rank, n) = (ctx.rank() as usize, ctx.nranks() as usize);
        let chunk_rows = chunk_rows.max(1);
        let mut seq = 0u64;
        let count = |rows: usize| {
            if let Some(p) = &progress {
                p.fetch_add(rows as u64, std::sync::atomic::Ordering::Relaxed);
            }
        };
        match self {
            Source::Parquet(path) => {
                let files = files_with(&path, DataFormat::Parquet)?;
                let table = parquet_table_schema(&files)?;
                // Work items are (file, row group, first row, rows). With
                // fewer row groups than ranks, row groups are cut into row
                // ranges so every rank reads a share.
                let mut groups = Vec::new();
                // The largest row group's size by its footer (uncompressed
                // bytes), which bounds the read-ahead below.
                let mut widest = 0u64;
                for f in &files {
                    let meta = parquet_meta(f)?;
                    for (g, rg) in meta.metadata().row_groups().iter().enumerate() {
                        groups.push((f.clone(), meta.clone(), g, rg.num_rows().max(0) as usize));
                        widest = widest.max(rg.total_byte_size().max(0) as u64);
                    }
                }
                let pieces = n.div_ceil(groups.len().max(1)).max(1);
                // Small groups go together up to a chunk's rows, and no
                // more than a rank's share, so that every rank still reads.
                let total: usize = groups.iter().map(|g| g.3).sum();
                let together = chunk_rows.min(total.div_ceil(n).max(1));
                let mut work: Vec<ParquetPiece> = Vec::new();
                for (f, meta, g, rows) in groups {
                    // Small row groups of one file are read together, up
                    // to a chunk's rows (8000 one-row groups were 8000
                    // reads and chunks).
                    if pieces == 1 {
                        // (Every piece is whole row groups here.)
                        if let Some(last) = work.last_mut().filter(|l| {
                            l.file == f
                                && l.groups.last() == Some(&g.wrapping_sub(1))
                                && l.len + rows <= together
                        }) {
                            last.groups.push(g);
                            last.len += rows;
                            continue;
                        }
                    }
                    for p in 0..pieces {
                        // In u128: a footer's row count times pieces may
                        // not fit a usize.
                        let cut = |q: usize| (rows as u128 * q as u128 / pieces as u128) as usize;
                        let (lo, hi) = (cut(p), cut(p + 1));
                        if hi > lo || (p == 0 && rows == 0) {
                            work.push(ParquetPiece {
                                file: f.clone(),
                                meta: meta.clone(),
                                groups: vec![g],
                                start: lo,
                                len: hi - lo,
                            });
                        }
                    }
                }
                // This rank's pieces decode on up to `rank_threads()`
                // threads at once (the host's cores shared among its
                // ranks), read ahead of the chunks being sent, and no more
                // at once than READ_AHEAD_BYTES of row groups hold by their
                // footers' sizes (at least one); chunks still leave in
                // piece order.
                let by_bytes = (READ_AHEAD_BYTES / widest.max(1)).max(1);
                let in_flight = crate::threads::rank_threads().min(by_bytes as usize);
                let mine = work
                    .into_iter()
                    .enumerate()
                    .filter(|(k, _)| k % n == rank)
                    .map(|(_, piece)| piece);
                let mut reads = futures::stream::iter(mine)
                    .map(|piece| {
                        let table = table.clone();
                        tokio::task::spawn_blocking(move || {
                            read_parquet_piece(&piece, chunk_rows)?
                                .into_iter()
                                .map(|b| as_table(b, &table, &piece.file))
                                .collect::<Result<Vec<_>>>()
                        })
                    })
                    .buffered(in_flight);
                while let Some(read) = reads.next().await {
                    for b in read.map_err(NodeError::other)?? {
                        count(b.num_rows());
                        out.send(Message::new(seq, b)).await?;
                        seq += 1;
                    }
                }
            }
            Source::Csv(path) => {
                let files = files_with(&path, DataFormat::Csv)?;
                let schema = csv_table_schema(&files)?;
                // With at least as many files as ranks, each rank reads
                // whole files of its own. Otherwise every rank parses each
                // file and keeps every n-th batch: a CSV cannot be cut at a
                // byte offset safely (quoted fields may hold line breaks).
                // Batches stream from the parser (two in flight), so a
                // rank holds its own share only, never a whole file.
                let by_file = files.len() >= n;
                let mut k = 0usize;
                for (i, f) in files.into_iter().enumerate() {
                    if by_file && i % n != rank {
                        continue;
                    }
                    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(2);
                    let schema = schema.clone();
                    let parser = tokio::task::spawn_blocking(move || {
                        // Dates and timestamps are read as text, then
                        // converted strictly (`csv_time`).
                        let read = csv_time::read_schema(&schema);
                        let reader = open_csv(&f).and_then(|file| {
                            arrow_csv::ReaderBuilder::new(read.clone())
                                .with_header(true)
                                .with_delimiter(csv_delimiter(&f)?)
                                // The reader sizes its buffers for a whole
                                // batch up front; smaller chunks are
                                // allowed ("at most").
                                .with_batch_size(chunk_rows.min(READ_BATCH_ROWS))
                                .build(file)
                                .map_err(|e| DataError::file(&f, e))
                        });
                        match reader {
                            Err(e) => {
                                let _ = tx.blocking_send(Err(e));
                            }
                            Ok(reader) => {
                                // The record number of the next batch's
                                // first row (the header is record 0).
                                let mut record = 1;
                                for b in reader {
                                    let b = b.map_err(|e| csv_error(&f, &read, e)).and_then(|b| {
                                        let rows = b.num_rows();
                                        let b = csv_time::convert(b, &schema, &f, record);
                                        record += rows;
                                        b
                                    });
                                    let failed = b.is_err();
                                    // A closed channel: the node stopped.
                                    if tx.blocking_send(b).is_err() || failed {
                                        break;
                                    }
                                }
                            }
                        }
                    });
                    while let Some(b) = rx.recv().await {
                        let b = b?;
                        let mine = by_file || k % n == rank;
                        k += 1;
                        if mine {
                            count(b.num_rows());
                            out.send(Message::new(seq, b)).await?;
                            seq += 1;
                        }
                    }
                    parser.await.map_err(NodeError::other)?;
                }
            }
            Source::Memory(_, batches) => {
                for b in batches {
                    let mut off = 0;
                    while off < b.num_rows() {
                        let len = chunk_rows.min(b.num_rows() - off);
                        count(len);
                        out.send(Message::new(seq, b.slice(off, len))).await?;
                        seq += 1;
                        off += len;
                    }
                }
            }
            Source::Generator(g) => {
                // In u128: rows times ranks may not fit a u64.
                let share = |r: u64| (u128::from(g.rows) * u128::from(r) / n as u128) as u64;
                let (lo, hi) = (share(rank as u64), share(rank as u64 + 1));
                // Chunks are made on up to `rank_threads()` threads at once
                // (a row's values depend on its index only) and leave in
                // order.
                let g = Arc::new(g);
                let threads = crate::threads::rank_threads();
                let ranges = (lo..hi)
                    .step_by(chunk_rows)
                    .map(move |at| (at, (at + chunk_rows as u64).min(hi)));
                let mut made = futures::stream::iter(ranges)
                    .map(|(at, end)| {
                        let g = g.clone();
                        tokio::task::spawn_blocking(move || g.batch(at, end))
                    })
                    .buffered(threads);
                while let Some(b) = made.next().await {
                    let b = b.map_err(NodeError::other)??;
                    count(b.num_rows());
                    out.send(Message::new(seq, b)).await?;
                    seq += 1;
                }
            }
        }
        Ok(())
    }
}

/// (Tests.) Rows `0..len` of row group `g` of `f`, in chunks of at most
/// `chunk_rows` rows.
#[cfg(test)]
fn read_group(f: &Path, g: usize, len: usize, chunk_rows: usize) -> Result<Vec<RecordBatch>> {
    let piece = ParquetPiece {
        file: f.to_path_buf(),
        meta: parquet_meta(f)?,
        groups: vec![g],
        start: 0,
        len,
    };
    read_parquet_piece(&piece, chunk_rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::arrow::ArrowWriter;

    fn write(path: &Path, schema: Schema, cols: Vec<ArrayRef>) {
        let b = RecordBatch::try_new(Arc::new(schema), cols).unwrap_or_else(|e| panic!("{e}"));
        let f = File::create(path).unwrap_or_else(|e| panic!("{e}"));
        let mut w = ArrowWriter::try_new(f, b.schema(), None).unwrap_or_else(|e| panic!("{e}"));
        w.write(&b).unwrap_or_else(|e| panic!("{e}"));
        w.close().unwrap_or_else(|e| panic!("{e}"));
    }

    /// A file of many small row groups (and one of fewer row groups than
    /// ranks) is read whole, every row once, on 1, 3 and 8 ranks and with
    /// chunks smaller and larger than its row groups: small groups are
    /// read together up to a chunk's rows, the footer once per file (a
    /// footer re-read per row group took 57 s for 8000 one-row groups).
    #[test]
    fn many_small_row_groups_are_read_once_each() {
        use parquet::file::properties::WriterProperties;
        let d = std::env::temp_dir().join(format!("braid-source-rg-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        for (rows, group) in [(3001i64, 7usize), (5, 2), (10, 100)] {
            let path = d.join(format!("rg-{rows}-{group}.parquet"));
            let b = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from((0..rows).collect::<Vec<_>>()))],
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let props = WriterProperties::builder()
                .set_max_row_group_row_count(Some(group))
                .build();
            let f = File::create(&path).unwrap_or_else(|e| panic!("{e}"));
            let mut w = ArrowWriter::try_new(f, schema.clone(), Some(props))
                .unwrap_or_else(|e| panic!("{e}"));
            w.write(&b).unwrap_or_else(|e| panic!("{e}"));
            w.close().unwrap_or_else(|e| panic!("{e}"));
            for n in [1u32, 3, 8] {
                for chunk in [5usize, 64, 65536] {
                    let got = rt.block_on(async {
                        let ctxs = braid_core::world::contexts(
                            &braid_core::WorldSpec::Local { nranks: n },
                            braid_core::MemoryLimits::UNLIMITED,
                        )
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                        let mut ids = Vec::new();
                        for ctx in ctxs {
                            let (tx, mut rx) = braid_core::channel(1 << 14);
                            Source::Parquet(path.clone())
                                .run(ctx, chunk, tx, None)
                                .await
                                .unwrap_or_else(|e| panic!("{e}"));
                            while let Some(m) = rx.recv().await {
                                let braid_core::Payload::Table(t) = m.payload else {
                                    panic!("a source sends tables")
                                };
                                let b = t.into_batch();
                                assert!(b.num_rows() <= chunk.max(group));
                                let c = b.column(0).as_any().downcast_ref::<Int64Array>();
                                ids.extend(c.map(|c| c.values().to_vec()).unwrap_or_default());
                            }
                        }
                        ids
                    });
                    let mut got = got;
                    got.sort_unstable();
                    assert_eq!(
                        got,
                        (0..rows).collect::<Vec<_>>(),
                        "{rows} rows in groups of {group}, {n} ranks, chunks of {chunk}"
                    );
                }
            }
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Files of one table that declare a column's nullability differently
    /// read as one nullable table (values and nulls kept); a column of
    /// a type no type shares with the first file's is an error that names
    /// it.
    #[test]
    fn parquet_files_differing_in_nullability_read_as_one_table() {
        let d = std::env::temp_dir().join(format!("braid-source-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        let fields = |ts_null: bool, ts: DataType| {
            Schema::new(vec![
                Field::new("ts", ts, ts_null),
                Field::new("v", DataType::Float64, true),
            ])
        };
        let (a, b, c) = (
            d.join("a.parquet"),
            d.join("b.parquet"),
            d.join("c.parquet"),
        );
        write(
            &a,
            fields(false, DataType::Int64),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(Float64Array::from(vec![0.5, 1.5])),
            ],
        );
        write(
            &b,
            fields(true, DataType::Int64),
            vec![
                Arc::new(Int64Array::from(vec![3, 4])),
                Arc::new(Float64Array::from(vec![None, Some(2.5)])),
            ],
        );
        let table = parquet_table_schema(&[a.clone(), b.clone()]).unwrap_or_else(|e| panic!("{e}"));
        assert!(table.field(0).is_nullable() && table.field(1).is_nullable());
        let mut batches = Vec::new();
        for f in [&a, &b] {
            for x in read_group(f, 0, 2, 16).unwrap_or_else(|e| panic!("{e}")) {
                batches.push(as_table(x, &table, f).unwrap_or_else(|e| panic!("{e}")));
            }
        }
        let all = arrow_select::concat::concat_batches(&table, &batches)
            .unwrap_or_else(|e| panic!("{e}"));
        let ts = all.column(0).as_any().downcast_ref::<Int64Array>();
        let v = all.column(1).as_any().downcast_ref::<Float64Array>();
        let (Some(ts), Some(v)) = (ts, v) else {
            panic!("column types: {:?}", all.schema())
        };
        assert_eq!(ts.values().to_vec(), vec![1, 2, 3, 4]);
        let vs: Vec<Option<f64>> = v.iter().collect();
        assert_eq!(vs, vec![Some(0.5), Some(1.5), None, Some(2.5)]);
        write(
            &c,
            fields(true, DataType::Utf8),
            vec![
                Arc::new(arrow_array::StringArray::from(vec!["5"])),
                Arc::new(Float64Array::from(vec![1.0])),
            ],
        );
        let e = parquet_table_schema(&[a, c]).err().map(|e| e.to_string());
        assert!(
            e.as_ref()
                .is_some_and(|e| e.contains("column \"ts\" is Utf8 here, Int64")),
            "{e:?}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Files of one table whose columns come in another order, or in
    /// types of one family (int32 and int64, string, large_string and a
    /// dictionary of strings, timestamps in two units), read as one table
    /// as DuckDB reads them: by name, in the common type, every value
    /// kept.
    #[test]
    fn parquet_files_differing_in_order_and_width_read_as_one_table() {
        use arrow_array::{
            Array, DictionaryArray, Int32Array, LargeStringArray, StringArray,
            TimestampMillisecondArray, TimestampNanosecondArray, types::Int8Type,
        };
        let d = std::env::temp_dir().join(format!("braid-source-widen-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        let (a, b, c) = (
            d.join("a.parquet"),
            d.join("b.parquet"),
            d.join("c.parquet"),
        );
        let ns = DataType::Timestamp(TimeUnit::Nanosecond, None);
        let ms = DataType::Timestamp(TimeUnit::Millisecond, None);
        write(
            &a,
            Schema::new(vec![
                Field::new("ts", ms.clone(), false),
                Field::new("k", DataType::Utf8, true),
                Field::new("v", DataType::Int32, true),
            ]),
            vec![
                Arc::new(TimestampMillisecondArray::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("x"), None])),
                Arc::new(Int32Array::from(vec![Some(-7), Some(i32::MAX)])),
            ],
        );
        let dict: DictionaryArray<Int8Type> = vec!["y", "y", "z"].into_iter().collect();
        write(
            &b,
            Schema::new(vec![
                Field::new("v", DataType::Int64, false),
                Field::new("k", dict.data_type().clone(), true),
                Field::new("ts", ns.clone(), true),
            ]),
            vec![
                Arc::new(Int64Array::from(vec![i64::MIN, 0, i64::MAX])),
                Arc::new(dict),
                Arc::new(TimestampNanosecondArray::from(vec![3_000_001, 4, 5])),
            ],
        );
        write(
            &c,
            Schema::new(vec![
                Field::new("k", DataType::LargeUtf8, true),
                Field::new("ts", ms.clone(), true),
                Field::new("v", DataType::Int32, true),
            ]),
            vec![
                Arc::new(LargeStringArray::from(vec!["w"])),
                Arc::new(TimestampMillisecondArray::from(vec![6])),
                Arc::new(Int32Array::from(vec![None])),
            ],
        );
        let files = [a, b, c];
        let table = parquet_table_schema(&files).unwrap_or_else(|e| panic!("{e}"));
        let types: Vec<(&str, &DataType)> = table
            .fields()
            .iter()
            .map(|f| (f.name().as_str(), f.data_type()))
            .collect();
        assert_eq!(
            types,
            [
                ("ts", &ns),
                ("k", &DataType::LargeUtf8),
                ("v", &DataType::Int64)
            ]
        );
        let mut batches = Vec::new();
        for (f, rows) in files.iter().zip([2, 3, 1]) {
            for x in read_group(f, 0, rows, 16).unwrap_or_else(|e| panic!("{e}")) {
                batches.push(as_table(x, &table, f).unwrap_or_else(|e| panic!("{e}")));
            }
        }
        let all = arrow_select::concat::concat_batches(&table, &batches)
            .unwrap_or_else(|e| panic!("{e}"));
        let col = |k: usize| all.column(k).as_any();
        let ts = col(0).downcast_ref::<TimestampNanosecondArray>();
        let k = col(1).downcast_ref::<LargeStringArray>();
        let v = col(2).downcast_ref::<Int64Array>();
        let (Some(ts), Some(k), Some(v)) = (ts, k, v) else {
            panic!("column types: {:?}", all.schema())
        };
        assert_eq!(
            ts.values().to_vec(),
            [1_000_000, 2_000_000, 3_000_001, 4, 5, 6_000_000]
        );
        let ks: Vec<Option<&str>> = k.iter().collect();
        assert_eq!(
            ks,
            [Some("x"), None, Some("y"), Some("y"), Some("z"), Some("w")]
        );
        let vs: Vec<Option<i64>> = v.iter().collect();
        assert_eq!(
            vs,
            [
                Some(-7),
                Some(i32::MAX as i64),
                Some(i64::MIN),
                Some(0),
                Some(i64::MAX),
                None
            ]
        );
        assert!(v.is_null(5));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Float spellings Arrow's inference does not know (`nan`,
    /// `Infinity`, `-INF`) among numbers make a float column, as DuckDB
    /// reads them, and read as those values; a column with words in it
    /// stays text. (They made the column text, and the job refused it as
    /// a value column.)
    #[test]
    fn csv_float_spellings_infer_a_float_column() {
        let d = std::env::temp_dir().join(format!("braid-source-nan-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        let p = d.join("v.csv");
        std::fs::write(
            &p,
            "ts,v,w\n1,nan,a\n2,Infinity,nan\n3,-INF,1\n4,1.5,2\n5,,3\n6,+inf,4\n7,2,5\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let schema = csv_schema(&p).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(schema.field(1).data_type(), &DataType::Float64);
        assert_eq!(schema.field(2).data_type(), &DataType::Utf8);
        let batch = arrow_csv::ReaderBuilder::new(Arc::new(schema))
            .with_header(true)
            .build(File::open(&p).unwrap_or_else(|e| panic!("{e}")))
            .unwrap_or_else(|e| panic!("{e}"))
            .next()
            .unwrap_or_else(|| panic!("no batch"))
            .unwrap_or_else(|e| panic!("{e}"));
        let v = batch
            .column(1)
            .as_any()
            .downcast_ref::<arrow_array::Float64Array>()
            .unwrap_or_else(|| panic!("not f64"));
        assert!(v.value(0).is_nan());
        assert_eq!(v.value(1), f64::INFINITY);
        assert_eq!(v.value(2), f64::NEG_INFINITY);
        assert_eq!(v.value(3), 1.5);
        assert!(arrow_array::Array::is_null(v, 4));
        assert_eq!(v.value(5), f64::INFINITY);
        assert_eq!(v.value(6), 2.0);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The delimiter is the header's most frequent of `,` `;` tab `|`
    /// outside quotes, `,` on ties and where none appears.
    #[test]
    fn csv_delimiters_are_found_from_the_header() {
        let d = std::env::temp_dir().join(format!("braid-source-delim-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        let cases: [(&str, u8); 7] = [
            ("a,b,c\n1;2,3\n", b','),
            ("a;b;c\n1,5;2;3\n", b';'),
            ("a\tb\n1\t2\n", b'\t'),
            ("a|b\n", b'|'),
            ("\"x;y;z\",b\n1,2\n", b','),
            ("a;b,c\n", b','),
            ("single\n1\n", b','),
        ];
        for (i, (text, want)) in cases.iter().enumerate() {
            let p = d.join(format!("{i}.csv"));
            std::fs::write(&p, text).unwrap_or_else(|e| panic!("{e}"));
            let got = csv_delimiter(&p).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(got, *want, "{text:?}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Integers past i64's range keep their digits (u64 where they fit
    /// it, else text) instead of becoming floats that make distinct ids
    /// equal; floats and integers within i64 read as before.
    #[test]
    fn csv_integers_past_i64_keep_their_digits() {
        let d = std::env::temp_dir().join(format!("braid-source-wide-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        let cases: [(&str, DataType); 5] = [
            (
                "1,12345678901234567891
2,12345678901234567892
",
                DataType::UInt64,
            ),
            (
                "1,5
2,18446744073709551615
",
                DataType::UInt64,
            ),
            (
                "1,-5
2,12345678901234567891
",
                DataType::Utf8,
            ),
            (
                "1,99999999999999999999999
",
                DataType::Utf8,
            ),
            (
                "1,1.5
2,12345678901234567891
",
                DataType::Float64,
            ),
        ];
        for (i, (rows, want)) in cases.iter().enumerate() {
            let p = d.join(format!("{i}.csv"));
            std::fs::write(&p, format!("ts,id\n{rows}")).unwrap_or_else(|e| panic!("{e}"));
            let t = csv_schema(&p).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(t.field(1).data_type(), want, "{rows:?}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A column whose values only look like dates or timestamps (a zero
    /// date, February 30th, a date-time and then words) is text, as
    /// DuckDB and Polars read it: the job runs where it does not use it.
    #[test]
    fn csv_columns_that_only_look_like_dates_are_text() {
        let d = std::env::temp_dir().join(format!("braid-source-notdate-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        let cases = [
            ("1,2024-01-05\n2,0000-00-00\n", DataType::Utf8),
            ("1,2024-01-05\n2,2024-02-30\n", DataType::Utf8),
            ("1,2024-01-05 10:00:00 run1\n", DataType::Utf8),
            ("1,2024-01-05 25:00:00.5\n", DataType::Utf8),
            ("1,2024-01-05\n2,2024-02-29\n", DataType::Date32),
            (
                "1,2024-01-05 10:00:00.5\n",
                DataType::Timestamp(TimeUnit::Microsecond, None),
            ),
        ];
        for (i, (rows, want)) in cases.iter().enumerate() {
            let p = d.join(format!("{i}.csv"));
            std::fs::write(&p, format!("ts,c\n{rows}")).unwrap_or_else(|e| panic!("{e}"));
            let t = csv_schema(&p).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(t.field(1).data_type(), want, "{rows:?}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A directory of Parquet files with a subdirectory named like a CSV
    /// file (an earlier job's output parts) reads as Parquet; an empty
    /// gzip-compressed CSV file among CSV parts is skipped, as an empty
    /// plain one is.
    #[test]
    fn directories_count_files_by_what_they_hold() {
        let d = std::env::temp_dir().join(format!("braid-source-dirs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let pq = d.join("pq");
        std::fs::create_dir_all(pq.join("old.csv")).unwrap_or_else(|e| panic!("{e}"));
        write(
            &pq.join("a.parquet"),
            Schema::new(vec![Field::new("ts", DataType::Int64, false)]),
            vec![Arc::new(Int64Array::from(vec![1, 2]))],
        );
        assert!(matches!(Source::at(pq.clone()), Source::Parquet(_)));
        let files = files_with(&pq, DataFormat::Parquet).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(files, [pq.join("a.parquet")]);
        let csv = d.join("csv");
        std::fs::create_dir_all(&csv).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(csv.join("a.csv"), "ts,v\n1,2.5\n").unwrap_or_else(|e| panic!("{e}"));
        let gz = std::fs::File::create(csv.join("b.csv.gz")).unwrap_or_else(|e| panic!("{e}"));
        flate2::write::GzEncoder::new(gz, flate2::Compression::default())
            .finish()
            .unwrap_or_else(|e| panic!("{e}"));
        let files = files_with(&csv, DataFormat::Csv).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(files, [csv.join("a.csv")]);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A Parquet dictionary of numbers (a pandas categorical of them, say)
    /// reads as its values, as DuckDB and Polars read it; a dictionary of
    /// strings stays one.
    #[test]
    fn parquet_dictionaries_of_numbers_read_as_their_values() {
        use arrow_array::{Array, DictionaryArray, types::Int32Type};
        let d = std::env::temp_dir().join(format!("braid-source-dictnum-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        let ts: DictionaryArray<Int32Type> = DictionaryArray::try_new(
            arrow_array::Int32Array::from(vec![0, 1, 1]),
            Arc::new(Int64Array::from(vec![5, 7])),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let k: DictionaryArray<Int32Type> = vec!["a", "b", "a"].into_iter().collect();
        let path = d.join("d.parquet");
        write(
            &path,
            Schema::new(vec![
                Field::new("ts", ts.data_type().clone(), false),
                Field::new("k", k.data_type().clone(), false),
            ]),
            vec![Arc::new(ts), Arc::new(k.clone())],
        );
        let t = Source::Parquet(path)
            .schema()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.field(0).data_type(), &DataType::Int64);
        assert_eq!(t.field(1).data_type(), k.data_type());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A CSV directory whose value column reads as text is refused with
    /// the file that makes it text, or the two whose types do not meet;
    /// other errors, and other inputs, are left as they are.
    #[test]
    fn text_columns_of_csv_directories_name_their_file() {
        let d = std::env::temp_dir().join(format!("braid-source-why-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let wrong = |found: &str| DataError::WrongType {
            name: "v".into(),
            found: found.into(),
            expected: "a numeric type".into(),
        };
        let case = |name: &str, files: &[(&str, &str)]| {
            let dir = d.join(name);
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
            for (f, text) in files {
                std::fs::write(dir.join(f), text).unwrap_or_else(|e| panic!("{e}"));
            }
            let src = Source::Csv(dir.clone());
            let t = src.schema().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(t.field(1).data_type(), &DataType::Utf8, "{name}");
            (dir, src.explain(wrong("Utf8")).to_string())
        };
        let (dir, e) = case(
            "text",
            &[
                ("a.csv", "ts,v\n1,1.5\n"),
                ("b.csv", "ts,v\n2,abc\n"),
                ("c.csv", "ts,v\n3,x\n"),
            ],
        );
        let b = dir.join("b.csv");
        assert!(
            e.contains(&format!(
                "Utf8 ({} holds text in it (such as \"abc\", neither a number nor a date)",
                b.display()
            )),
            "{e}"
        );
        let (dir, e) = case(
            "spaced",
            &[("a.csv", "ts,v\n1,1.5\n2, 2.5\n"), ("b.csv", "ts,v\n3,7\n")],
        );
        let a = dir.join("a.csv");
        assert!(
            e.contains(&format!(
                "Utf8 ({} holds text in it (such as \" 2.5\": a number or date with spaces around it is text)",
                a.display()
            )),
            "{e}"
        );
        let (dir, e) = case(
            "clash",
            &[
                ("a.csv", "ts,v\n1,\n"),
                ("b.csv", "ts,v\n2,2024-01-02\n"),
                ("c.csv", "ts,v\n3,7\n"),
            ],
        );
        let (b, c) = (dir.join("b.csv"), dir.join("c.csv"));
        assert!(
            e.contains(&format!(
                "{} reads it as Int64, {} as Date32",
                c.display(),
                b.display()
            )),
            "{e}"
        );
        // Not text, or not CSV: unchanged.
        let src = Source::Csv(dir);
        assert_eq!(
            src.explain(wrong("Date32")).to_string(),
            wrong("Date32").to_string()
        );
        let one = arrow_schema::Field::new("v", DataType::Utf8, true);
        let mem = Source::Memory(Arc::new(Schema::new(vec![one])), Vec::new());
        assert_eq!(
            mem.explain(wrong("Utf8")).to_string(),
            wrong("Utf8").to_string()
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Every codec that pyarrow, DuckDB and Polars write reads back (Brotli
    /// was missing from the build: "Disabled feature at compile time").
    #[test]
    fn parquet_files_of_every_common_codec_read() {
        use parquet::basic::{BrotliLevel, Compression, GzipLevel, ZstdLevel};
        use parquet::file::properties::WriterProperties;
        let d = std::env::temp_dir().join(format!("braid-source-codec-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let want: Vec<i64> = (0..1000).map(|i| i * i - 7).collect();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from(want.clone()))],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        for codec in [
            Compression::UNCOMPRESSED,
            Compression::SNAPPY,
            Compression::GZIP(GzipLevel::default()),
            Compression::LZ4_RAW,
            Compression::ZSTD(ZstdLevel::default()),
            Compression::BROTLI(BrotliLevel::default()),
        ] {
            let p = d.join(format!("{codec:?}.parquet"));
            let props = WriterProperties::builder().set_compression(codec).build();
            let f = File::create(&p).unwrap_or_else(|e| panic!("{e}"));
            let mut w = ArrowWriter::try_new(f, schema.clone(), Some(props))
                .unwrap_or_else(|e| panic!("{codec:?}: {e}"));
            w.write(&batch).unwrap_or_else(|e| panic!("{codec:?}: {e}"));
            w.close().unwrap_or_else(|e| panic!("{codec:?}: {e}"));
            let got =
                read_group(&p, 0, want.len(), 4096).unwrap_or_else(|e| panic!("{codec:?}: {e}"));
            let got: Vec<i64> = got
                .iter()
                .flat_map(|b| {
                    let a = b.column(0).as_any().downcast_ref::<Int64Array>();
                    a.map(|a| a.values().to_vec()).unwrap_or_default()
                })
                .collect();
            assert_eq!(got, want, "{codec:?}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}

#[cfg(test)]
mod zone_tests {
    use super::*;
    use arrow_array::TimestampMillisecondArray;
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::KeyValue;
    use parquet::file::properties::WriterProperties;

    /// A `timestamp[s, tz]` column as pyarrow stores it (milliseconds in
    /// UTC, the zone only in the file's Arrow schema) reads with its zone:
    /// before, it came back in UTC and calendar windows used UTC's clock.
    #[test]
    fn second_timestamps_with_a_zone_keep_it() {
        let d = std::env::temp_dir().join(format!("braid-source-zone-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        let path = d.join("tz.parquet");
        let stored = Arc::new(Schema::new(vec![Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            false,
        )]));
        let written = Schema::new(vec![Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Second, Some("America/New_York".into())),
            false,
        )]);
        let ms = vec![1_730_592_000_000i64, 1_730_595_600_000];
        let b = RecordBatch::try_new(
            stored.clone(),
            vec![Arc::new(
                TimestampMillisecondArray::from(ms.clone()).with_timezone("UTC"),
            )],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let props = WriterProperties::builder()
            .set_key_value_metadata(Some(vec![KeyValue::new(
                parquet::arrow::ARROW_SCHEMA_META_KEY.to_string(),
                parquet::arrow::encode_arrow_schema(&written),
            )]))
            .build();
        let opts = parquet::arrow::arrow_writer::ArrowWriterOptions::new()
            .with_properties(props)
            .with_skip_arrow_metadata(true);
        let f = File::create(&path).unwrap_or_else(|e| panic!("{e}"));
        let mut w =
            ArrowWriter::try_new_with_options(f, stored, opts).unwrap_or_else(|e| panic!("{e}"));
        w.write(&b).unwrap_or_else(|e| panic!("{e}"));
        w.close().unwrap_or_else(|e| panic!("{e}"));
        let schema =
            parquet_table_schema(std::slice::from_ref(&path)).unwrap_or_else(|e| panic!("{e}"));
        let want = DataType::Timestamp(TimeUnit::Millisecond, Some("America/New_York".into()));
        assert_eq!(schema.field(0).data_type(), &want);
        let got = read_group(&path, 0, 2, 16).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got[0].schema().field(0).data_type(), &want);
        let vals = got[0]
            .column(0)
            .as_any()
            .downcast_ref::<TimestampMillisecondArray>()
            .map(|a| a.values().to_vec());
        assert_eq!(vals, Some(ms), "the instants are unchanged");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A dictionary of decimals (pyarrow keeps the type in the file's
    /// Arrow schema) reads as its decimals: the reader, hinted with the
    /// dictionary type, failed the whole file.
    #[test]
    fn dictionaries_of_decimals_read_as_decimals() {
        use arrow_array::{Array, Decimal128Array, DictionaryArray, Int32Array, types::Int32Type};
        let d = std::env::temp_dir().join(format!("braid-source-ddec-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        let path = d.join("d.parquet");
        let values = Decimal128Array::from(vec![125i128, -3500])
            .with_precision_and_scale(12, 3)
            .unwrap_or_else(|e| panic!("{e}"));
        let dict = DictionaryArray::<Int32Type>::try_new(
            Int32Array::from(vec![Some(0), None, Some(1), Some(0)]),
            Arc::new(values),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let schema = Arc::new(Schema::new(vec![Field::new(
            "dec",
            dict.data_type().clone(),
            true,
        )]));
        let b = RecordBatch::try_new(schema.clone(), vec![Arc::new(dict)])
            .unwrap_or_else(|e| panic!("{e}"));
        let f = File::create(&path).unwrap_or_else(|e| panic!("{e}"));
        let mut w = ArrowWriter::try_new(f, schema, None).unwrap_or_else(|e| panic!("{e}"));
        w.write(&b).unwrap_or_else(|e| panic!("{e}"));
        w.close().unwrap_or_else(|e| panic!("{e}"));
        let got = read_group(&path, 0, 4, 16).unwrap_or_else(|e| panic!("{e}"));
        let dec = got[0]
            .column(0)
            .as_any()
            .downcast_ref::<Decimal128Array>()
            .map(|a| a.iter().collect::<Vec<_>>());
        assert_eq!(dec, Some(vec![Some(125), None, Some(-3500), Some(125)]));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A Parquet INTERVAL column with months (as DuckDB writes one, no
    /// Arrow schema kept) is refused, naming the column and the row: the
    /// reader keeps only days and milliseconds, and `1 month 2 days` went
    /// on as `2 days`. Without months the column reads, unchanged.
    #[test]
    fn intervals_with_months_are_refused_not_cut() {
        use arrow_array::{IntervalDayTimeArray, IntervalYearMonthArray};
        use arrow_buffer::IntervalDayTime;
        use arrow_schema::IntervalUnit;
        let d = std::env::temp_dir().join(format!("braid-source-ivl-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        let write = |name: &str, col: ArrayRef| {
            let path = d.join(name);
            let schema = Arc::new(Schema::new(vec![
                Field::new("ts", DataType::Int64, false),
                Field::new("iv", col.data_type().clone(), true),
            ]));
            let b = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from(vec![1i64, 2, 3])), col],
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let opts = parquet::arrow::arrow_writer::ArrowWriterOptions::new()
                .with_skip_arrow_metadata(true);
            let f = File::create(&path).unwrap_or_else(|e| panic!("{e}"));
            let mut w = ArrowWriter::try_new_with_options(f, schema, opts)
                .unwrap_or_else(|e| panic!("{e}"));
            w.write(&b).unwrap_or_else(|e| panic!("{e}"));
            w.close().unwrap_or_else(|e| panic!("{e}"));
            path
        };
        // Months, stored as INTERVAL (12 bytes), read back as days and ms.
        let months = write(
            "m.parquet",
            Arc::new(IntervalYearMonthArray::from(vec![Some(0), None, Some(5)])),
        );
        let e = read_group(&months, 0, 3, 2).err().map(|e| e.to_string());
        assert!(
            e.as_ref()
                .is_some_and(|e| e.contains("column \"iv\"") && e.contains("row 2")),
            "{e:?}"
        );
        // Rows without months, in a piece of their own, read.
        assert!(read_group(&months, 0, 2, 2).is_ok());
        let days = vec![
            Some(IntervalDayTime::new(2, 1001)),
            None,
            Some(IntervalDayTime::new(-1, 5)),
        ];
        let path = write(
            "d.parquet",
            Arc::new(IntervalDayTimeArray::from(days.clone())),
        );
        let got = read_group(&path, 0, 3, 16).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            got[0].column(1).data_type(),
            &DataType::Interval(IntervalUnit::DayTime)
        );
        let vals = got[0]
            .column(1)
            .as_any()
            .downcast_ref::<IntervalDayTimeArray>()
            .map(|a| a.iter().collect::<Vec<_>>());
        assert_eq!(vals, Some(days));
        let _ = std::fs::remove_dir_all(&d);
    }
}

#[cfg(test)]
mod dir_tests {
    use super::*;

    /// A directory is read whole or refused: files of the other format,
    /// or data files in a subdirectory, are an error naming one of them
    /// (they used to be skipped without a word).
    #[test]
    fn directories_with_other_files_are_refused_not_read_in_part() {
        let d = std::env::temp_dir().join(format!("braid-source-dirs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let sub = d.join("part=2");
        std::fs::create_dir_all(&sub).unwrap_or_else(|e| panic!("{e}"));
        let touch = |p: &Path| std::fs::write(p, b"x").unwrap_or_else(|e| panic!("{e}"));
        touch(&d.join("b.parquet"));
        touch(&d.join("a.parquet"));
        touch(&d.join("c.PQ"));
        // Not data by their names (Spark's marker and checksums, Dask's
        // metadata): skipped.
        touch(&d.join("_SUCCESS"));
        touch(&d.join(".a.parquet.crc"));
        touch(&d.join("_metadata"));
        // A part file without an ending is Parquet by its magic bytes.
        std::fs::write(d.join("000000_0"), b"PAR1...").unwrap_or_else(|e| panic!("{e}"));
        let ok = files_with(&d, DataFormat::Parquet).unwrap_or_else(|e| panic!("{e}"));
        let want = ["000000_0", "a.parquet", "b.parquet", "c.PQ"].map(|f| d.join(f));
        assert_eq!(ok, want);
        assert!(matches!(Source::at(d.clone()), Source::Parquet(_)));
        // A file of neither format is refused, not skipped (it was).
        touch(&d.join("notes.txt"));
        let e = files_with(&d, DataFormat::Parquet)
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_ref()
                .is_some_and(|e| e.contains("notes.txt is neither")),
            "{e:?}"
        );
        std::fs::remove_file(d.join("notes.txt")).unwrap_or_else(|e| panic!("{e}"));
        touch(&sub.join("c.parquet"));
        let e = files_with(&d, DataFormat::Parquet)
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_ref()
                .is_some_and(|e| e.contains("c.parquet") && e.contains("subdirectory")),
            "{e:?}"
        );
        std::fs::remove_file(sub.join("c.parquet")).unwrap_or_else(|e| panic!("{e}"));
        // A named pipe is refused without being opened (opening one waits
        // for a writer: the job hung), and so is one given as the input.
        #[cfg(unix)]
        {
            let fifo = d.join("000001_0");
            let made = std::process::Command::new("mkfifo").arg(&fifo).status();
            assert!(made.is_ok_and(|s| s.success()), "mkfifo");
            for p in [&d, &fifo] {
                let e = files_with(p, DataFormat::Parquet)
                    .err()
                    .map(|e| e.to_string());
                assert!(
                    e.as_ref().is_some_and(|e| e.contains("not a regular file")),
                    "{e:?}"
                );
            }
            std::fs::remove_file(&fifo).unwrap_or_else(|e| panic!("{e}"));
        }
        touch(&d.join("x.CSV.gz"));
        assert!(matches!(Source::at(d.clone()), Source::Csv(_)));
        for format in [DataFormat::Parquet, DataFormat::Csv] {
            let e = files_with(&d, format).err().map(|e| e.to_string());
            assert!(
                e.as_ref().is_some_and(|e| e.contains("both")),
                "{format:?}: {e:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
