//! A Parquet file writer that encodes a batch's columns on several threads,
//! and a concatenation of Parquet files that copies their encoded row
//! groups.
//!
//! Encoding is most of a Parquet sink's CPU time (snappy compression, the
//! dictionary attempt, statistics: about 2.4 s for 10M rows of 10 columns
//! on one core of the 2-core VM, 2026-11-26), and Arrow's `ArrowWriter`
//! does it column after column on one thread. [`ColumnParallelWriter`]
//! writes the file `ArrowWriter` writes (same properties, row groups cut at
//! the same row counts and estimated byte sizes, the same metadata) with
//! the columns of each batch, and the closing of each row group's column
//! chunks, spread over up to `threads` scoped threads. It refuses
//! content-defined chunking (braid's sink does not use it):
//!
//! ```text
//!   batch -> leaves (one per Parquet column) -> [threads] encode into
//!   the row group's column writers -> at max_row_group_row_count rows or
//!   max_row_group_bytes estimated encoded bytes: [threads] close each
//!   column chunk -> append them in column order
//! ```
//!
//! The open row group is held in memory, encoded, until it is cut: the
//! byte limit is what bounds that for wide tables (173 columns of 8 bytes
//! at 1M rows a group held ~1 GiB a rank).
//!
//! Cost model: a batch costs its encoding split over the threads, plus one
//! thread start per thread used (tens of us, against the ~15 ms that
//! encoding a 64K-row chunk of 10 columns takes on one core); batches of
//! fewer than [`PARALLEL_MIN_CELLS`] values stay on one thread. Columns are
//! the unit of work, so a table of k columns gains at most k-fold.

use std::fs::File;
use std::path::Path;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::{
    ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory, compute_leaves,
};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::ParquetError;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaDataReader};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;

use crate::threads::map_scoped;

/// Values (rows x leaf columns) below which a batch, or a row group's
/// closing, stays on the caller's thread.
pub const PARALLEL_MIN_CELLS: usize = 1 << 16;

/// Parquet writer with column-parallel encoding (see the module doc).
pub struct ColumnParallelWriter {
    file: SerializedFileWriter<File>,
    factory: ArrowRowGroupWriterFactory,
    schema: SchemaRef,
    /// The open row group's column writers, one per Parquet leaf column.
    columns: Vec<ArrowColumnWriter>,
    /// Index of the open row group.
    row_group: usize,
    /// Rows written into the open row group.
    rows: usize,
    max_rows: usize,
    /// The estimated encoded bytes at which a row group is cut.
    max_bytes: Option<usize>,
    threads: usize,
    /// A write failed: the columns may hold different row counts, so
    /// every later call fails.
    failed: bool,
}

impl ColumnParallelWriter {
    /// A writer of `schema` into `file` with `props`, encoding on up to
    /// `threads` threads (1: on the caller's thread only).
    pub fn try_new(
        file: File,
        schema: SchemaRef,
        props: WriterProperties,
        threads: usize,
    ) -> Result<Self, ParquetError> {
        if props.content_defined_chunking().is_some() {
            return Err(ParquetError::General(
                "column-parallel Parquet writer: content-defined chunking is not supported".into(),
            ));
        }
        let max_rows = props.max_row_group_row_count().unwrap_or(usize::MAX).max(1);
        let max_bytes = props.max_row_group_bytes();
        // Through ArrowWriter so the file carries the same metadata (the
        // Arrow schema) as one that ArrowWriter writes.
        let (file, factory) =
            ArrowWriter::try_new(file, schema.clone(), Some(props))?.into_serialized_writer()?;
        let columns = factory.create_column_writers(0)?;
        Ok(ColumnParallelWriter {
            file,
            factory,
            schema,
            columns,
            row_group: 0,
            rows: 0,
            max_rows,
            max_bytes,
            threads: threads.max(1),
            failed: false,
        })
    }

    /// Appends `batch` (of the writer's schema), cutting row groups at the
    /// properties' row count and estimated byte size as `ArrowWriter`
    /// does: a batch that would take the open group past its byte limit
    /// at the group's average row size so far is split there.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<(), ParquetError> {
        self.check()?;
        if batch.schema().fields() != self.schema.fields() {
            return Err(ParquetError::General(format!(
                "batch schema {:?} differs from the file's {:?}",
                batch.schema(),
                self.schema
            )));
        }
        let mut at = 0;
        while at < batch.num_rows() {
            let mut take = (self.max_rows - self.rows).min(batch.num_rows() - at);
            self.failed = true;
            if let Some(max) = self.max_bytes.filter(|_| self.rows > 0) {
                let bytes = self.estimated_bytes();
                // What fits at the group's average row size so far.
                let fit = (max.saturating_sub(bytes)).checked_div(bytes / self.rows);
                if bytes >= max || fit == Some(0) {
                    self.flush_row_group()?;
                    self.failed = false;
                    continue;
                }
                if let Some(fit) = fit {
                    take = take.min(fit);
                }
            }
            self.encode(&batch.slice(at, take))?;
            at += take;
            self.rows += take;
            if self.rows >= self.max_rows
                || self.max_bytes.is_some_and(|m| self.estimated_bytes() >= m)
            {
                self.flush_row_group()?;
            }
            self.failed = false;
        }
        Ok(())
    }

    /// The open row group's estimated encoded size (ArrowWriter's measure).
    fn estimated_bytes(&self) -> usize {
        self.columns
            .iter()
            .map(|c| c.get_estimated_total_bytes())
            .sum()
    }

    /// Writes the open row group (if it has rows) and the footer.
    pub fn close(mut self) -> Result<(), ParquetError> {
        self.check()?;
        if self.rows > 0 {
            self.flush_row_group()?;
        }
        self.file.close()?;
        Ok(())
    }

    fn check(&self) -> Result<(), ParquetError> {
        if self.failed {
            return Err(ParquetError::General(
                "an earlier write to this Parquet file failed".into(),
            ));
        }
        Ok(())
    }

    /// Threads for `cells` values of work.
    fn threads_for(&self, cells: usize) -> usize {
        if cells < PARALLEL_MIN_CELLS {
            1
        } else {
            self.threads
        }
    }

    fn encode(&mut self, batch: &RecordBatch) -> Result<(), ParquetError> {
        let mut leaves = Vec::with_capacity(self.columns.len());
        for (field, col) in self.schema.fields().iter().zip(batch.columns()) {
            leaves.extend(compute_leaves(field, col)?);
        }
        if leaves.len() != self.columns.len() {
            return Err(ParquetError::General(format!(
                "{} leaf columns for {} column writers",
                leaves.len(),
                self.columns.len()
            )));
        }
        let threads = self.threads_for(batch.num_rows() * leaves.len());
        let work: Vec<_> = self.columns.iter_mut().zip(leaves.iter()).collect();
        for r in map_scoped(work, threads, |(w, leaf)| w.write(leaf)) {
            r?;
        }
        Ok(())
    }

    fn flush_row_group(&mut self) -> Result<(), ParquetError> {
        let next = self.factory.create_column_writers(self.row_group + 1)?;
        let done = std::mem::replace(&mut self.columns, next);
        let threads = self.threads_for(self.rows * done.len());
        let chunks: Vec<ArrowColumnChunk> = map_scoped(done, threads, |w| w.close())
            .into_iter()
            .collect::<Result<_, _>>()?;
        let mut rg = self.file.next_row_group()?;
        for c in chunks {
            c.append_to_row_group(&mut rg)?;
        }
        rg.close()?;
        self.row_group += 1;
        self.rows = 0;
        Ok(())
    }
}

/// Writes the row groups of `parts` (Parquet files of `schema`, as
/// [`ColumnParallelWriter`] or `ArrowWriter` wrote them), in order, into
/// `out`, copying their encoded column chunks with their statistics and
/// page indexes (no decoding); `props` serve the output's footer. Each
/// part's row groups stay as they were (the output has at least one per
/// non-empty part). Bloom filters are not copied (braid writes none).
/// Parts whose Parquet schema differs from `schema`'s are refused; errors
/// name the part. Setting `stop` ends the copy at the next row group with
/// an error (the job it was for was abandoned).
pub fn concat_parquet(
    parts: &[impl AsRef<Path>],
    out: File,
    schema: SchemaRef,
    props: WriterProperties,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(), ParquetError> {
    let (mut writer, _) =
        ArrowWriter::try_new(out, schema, Some(props))?.into_serialized_writer()?;
    let expected = writer.schema_descr().root_schema().clone();
    for p in parts {
        let named = |e: &dyn std::fmt::Display| {
            ParquetError::General(format!("{}: {e}", p.as_ref().display()))
        };
        let input = File::open(p.as_ref()).map_err(|e| named(&e))?;
        let meta = ParquetMetaDataReader::new()
            .with_page_index_policy(PageIndexPolicy::Optional)
            .parse_and_finish(&input)
            .map_err(|e| named(&e))?;
        if meta.file_metadata().schema_descr().root_schema() != &expected {
            return Err(named(&"its Parquet schema differs from the output's"));
        }
        let index = meta.page_index();
        for (g, rg) in meta.row_groups().iter().enumerate() {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(ParquetError::General(
                    "stopped: the job was abandoned".into(),
                ));
            }
            let mut out_rg = writer.next_row_group()?;
            for (c, column) in rg.columns().iter().enumerate() {
                let close = ColumnCloseResult {
                    bytes_written: column.compressed_size() as u64,
                    rows_written: rg.num_rows() as u64,
                    metadata: column.clone(),
                    bloom_filter: None,
                    column_index: index.and_then(|i| i.column_index(g, c).cloned()),
                    offset_index: index.and_then(|i| i.offset_index(g, c).cloned()),
                };
                out_rg.append_column(&input, close).map_err(|e| named(&e))?;
            }
            out_rg.close()?;
        }
    }
    writer.close()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use arrow_array::builder::{Int64Builder, ListBuilder};
    use arrow_array::{ArrayRef, Float64Array, Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use braid_kernels::hash::mix64;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use std::path::PathBuf;
    use std::sync::Arc;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("braid-pqw-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int64, true),
            Field::new("x", DataType::Float64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new(
                "l",
                DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
                true,
            ),
        ]))
    }

    /// `rows` rows of fresh pseudo-random data (nulls, repeats, lists of
    /// 0-3 items) from `seed`.
    fn batch(seed: u64, rows: usize) -> RecordBatch {
        let r = |k: usize, c: u64| mix64(seed ^ (k as u64).wrapping_mul(0x9E37) ^ (c << 48));
        let i: Int64Array = (0..rows)
            .map(|k| (r(k, 1) % 10 != 0).then(|| (r(k, 2) % 50) as i64 - 25))
            .collect();
        let x: Float64Array = (0..rows)
            .map(|k| (r(k, 3) % 7 != 0).then(|| (r(k, 4) as f64) / 1e15 - 9e3))
            .collect();
        let s: StringArray = (0..rows)
            .map(|k| (r(k, 5) % 5 != 0).then(|| format!("v{}", r(k, 6) % 300)))
            .collect();
        let mut l = ListBuilder::new(Int64Builder::new());
        for k in 0..rows {
            if r(k, 7) % 6 == 0 {
                l.append(false);
            } else {
                for j in 0..r(k, 8) % 4 {
                    l.values().append_value((r(k, 9) ^ j) as i64 % 1000);
                }
                l.append(true);
            }
        }
        let cols: Vec<ArrayRef> = vec![Arc::new(i), Arc::new(x), Arc::new(s), Arc::new(l.finish())];
        RecordBatch::try_new(schema(), cols).unwrap()
    }

    fn read(path: &Path) -> (Vec<RecordBatch>, Vec<i64>) {
        let b = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
        let groups = b
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.num_rows())
            .collect();
        assert_eq!(b.schema().fields(), schema().fields());
        (b.build().unwrap().map(|b| b.unwrap()).collect(), groups)
    }

    fn concat(bs: &[RecordBatch]) -> RecordBatch {
        arrow_select::concat::concat_batches(&schema(), bs).unwrap()
    }

    fn props(group_rows: usize) -> WriterProperties {
        props_bytes(group_rows, None)
    }

    fn props_bytes(group_rows: usize, group_bytes: Option<usize>) -> WriterProperties {
        WriterProperties::builder()
            .set_max_row_group_row_count(Some(group_rows))
            .set_max_row_group_bytes(group_bytes)
            .set_data_page_row_count_limit(100)
            .set_write_batch_size(50)
            .set_compression(parquet::basic::Compression::SNAPPY)
            .build()
    }

    fn seed() -> u64 {
        let s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        eprintln!("seed {s}");
        s
    }

    #[test]
    fn parallel_writer_round_trips_with_row_groups_cut_as_arrow_writer_cuts_them() {
        let seed = seed();
        let d = dir("round");
        // Batches of odd sizes (an empty one too) across row groups of
        // 20000; the largest batch and the full row groups are big enough
        // (rows x 4 leaves >= PARALLEL_MIN_CELLS) to take the threads.
        let sizes = [700usize, 0, 1, 1299, 45_000, 333];
        let batches: Vec<RecordBatch> = sizes
            .iter()
            .enumerate()
            .map(|(k, &n)| batch(seed.wrapping_add(k as u64), n))
            .collect();
        let want = concat(&batches);
        // Row groups cut by rows; and by estimated bytes (~30 KB: groups
        // of a few thousand rows, batches split where they would pass it).
        for (threads, bytes) in [1, 2, 3, 8]
            .into_iter()
            .flat_map(|t| [(t, None), (t, Some(30_000))])
        {
            let props = || props_bytes(20_000, bytes);
            let p = d.join(format!("t{threads}.parquet"));
            let mut w = ColumnParallelWriter::try_new(
                File::create(&p).unwrap(),
                schema(),
                props(),
                threads,
            )
            .unwrap();
            for b in &batches {
                w.write(b).unwrap();
            }
            w.close().unwrap();
            let (got, groups) = read(&p);
            assert_eq!(concat(&got), want, "threads {threads}, bytes {bytes:?}");
            // ArrowWriter with the same properties: the same row groups.
            let q = d.join("arrow.parquet");
            let mut a =
                ArrowWriter::try_new(File::create(&q).unwrap(), schema(), Some(props())).unwrap();
            for b in &batches {
                a.write(b).unwrap();
            }
            a.close().unwrap();
            assert_eq!(groups, read(&q).1, "threads {threads}, bytes {bytes:?}");
            assert_eq!(groups.iter().sum::<i64>(), want.num_rows() as i64);
            if bytes.is_some() {
                assert!(groups.len() > 5, "no groups cut by bytes: {groups:?}");
            }
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn parallel_writer_without_rows_writes_an_empty_file_of_the_schema() {
        let d = dir("empty");
        let p = d.join("e.parquet");
        let w = ColumnParallelWriter::try_new(File::create(&p).unwrap(), schema(), props(10), 4)
            .unwrap();
        w.close().unwrap();
        let (got, groups) = read(&p);
        assert!(groups.is_empty());
        assert_eq!(got.iter().map(|b| b.num_rows()).sum::<usize>(), 0);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn parallel_writer_refuses_a_batch_of_another_schema() {
        let d = dir("other");
        let p = d.join("o.parquet");
        let mut w =
            ColumnParallelWriter::try_new(File::create(&p).unwrap(), schema(), props(10), 2)
                .unwrap();
        let other = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("i", DataType::Int64, true)])),
            vec![Arc::new(Int64Array::from(vec![1i64]))],
        )
        .unwrap();
        assert!(w.write(&other).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn concat_copies_every_part_in_order() {
        let seed = seed();
        let d = dir("concat");
        // Parts with several row groups, one row group, none at all.
        let sizes = [2300usize, 0, 999, 1, 4000];
        let mut parts = Vec::new();
        let mut all = Vec::new();
        for (k, &n) in sizes.iter().enumerate() {
            let b = batch(seed.wrapping_add(100 + k as u64), n);
            let p = d.join(format!("part-{k}.parquet"));
            let mut w =
                ColumnParallelWriter::try_new(File::create(&p).unwrap(), schema(), props(1000), 2)
                    .unwrap();
            w.write(&b).unwrap();
            w.close().unwrap();
            parts.push(p);
            all.push(b);
        }
        let out = d.join("all.parquet");
        concat_parquet(
            &parts,
            File::create(&out).unwrap(),
            schema(),
            props(1000),
            &Default::default(),
        )
        .unwrap();
        let (got, groups) = read(&out);
        assert_eq!(concat(&got), concat(&all));
        let mut want_groups = Vec::new();
        for p in &parts {
            want_groups.extend(read(p).1);
        }
        assert_eq!(groups, want_groups);
        // The copied page index points at the copied pages: a selection
        // read through it (pages of 100 rows skipped) gives the same rows.
        let want = concat(&all);
        let (from, len) = (1234usize, 3000usize);
        let opts = parquet::arrow::arrow_reader::ArrowReaderOptions::new()
            .with_page_index_policy(PageIndexPolicy::Required);
        let sel = parquet::arrow::arrow_reader::RowSelection::from(vec![
            parquet::arrow::arrow_reader::RowSelector::skip(from),
            parquet::arrow::arrow_reader::RowSelector::select(len),
        ]);
        let got: Vec<RecordBatch> =
            ParquetRecordBatchReaderBuilder::try_new_with_options(File::open(&out).unwrap(), opts)
                .unwrap()
                .with_row_selection(sel)
                .build()
                .unwrap()
                .map(|b| b.unwrap())
                .collect();
        assert_eq!(concat(&got), want.slice(from, len));
        // A part of another schema is refused.
        let odd = d.join("odd.parquet");
        let s2 = Arc::new(Schema::new(vec![Field::new("z", DataType::Int64, true)]));
        let mut w = ArrowWriter::try_new(File::create(&odd).unwrap(), s2.clone(), None).unwrap();
        w.write(&RecordBatch::try_new(s2, vec![Arc::new(Int64Array::from(vec![1i64]))]).unwrap())
            .unwrap();
        w.close().unwrap();
        let bad = [parts[0].clone(), odd];
        let e = concat_parquet(
            &bad,
            File::create(d.join("bad.parquet")).unwrap(),
            schema(),
            props(10),
            &Default::default(),
        );
        assert!(e.unwrap_err().to_string().contains("differs"));
        let _ = std::fs::remove_dir_all(&d);
    }
}
