//! `DeviceTable`: a table chunk whose columns live in device memory, so a
//! GPU pipeline's chunks flow through the same channels and nodes as host
//! chunks (`Payload::Device`).
//!
//! A column is its fixed-width values (the Arrow layout: `width` bytes per
//! row; booleans one byte per row) plus, when it has nulls, one validity
//! byte per row (0 = null). Bytes, not bits: kernels index rows directly.
//! Variable-width types (strings, lists) have no device form: converting a
//! batch that holds one fails with an error that names the column.
//!
//! A table is cheap to clone (columns are shared) and read-only once made;
//! kernels write new buffers.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, make_array};
use arrow_buffer::{BooleanBuffer, Buffer, MutableBuffer, NullBuffer};
use arrow_data::ArrayData;
use arrow_schema::{DataType, SchemaRef};
use cudarc::driver::result;

use super::buffer::DeviceBuffer;
use super::device::{Gpu, GpuEvent};
use super::error::CudaError;
use super::pinned::PinnedBlock;

/// One column on the device.
#[derive(Debug)]
pub struct DeviceColumn {
    /// Values, `width` bytes per row.
    pub data: DeviceBuffer,
    /// One byte per row (0 = null); `None` when the column has no nulls.
    pub valid: Option<DeviceBuffer>,
}

/// A chunk of a table in device memory.
#[derive(Debug, Clone)]
pub struct DeviceTable {
    schema: SchemaRef,
    columns: Arc<Vec<DeviceColumn>>,
    rows: usize,
}

/// Bytes per row of `t` on the device, or `None` for a type with no device
/// form (variable width).
pub fn device_width(t: &DataType) -> Option<usize> {
    match t {
        DataType::Boolean => Some(1),
        t if t.is_primitive() => t.primitive_width(),
        _ => None,
    }
}

impl DeviceTable {
    /// A table from columns made on the device; checks the column count,
    /// types and lengths against `schema` and `rows`.
    pub fn new(
        gpu: &Gpu,
        schema: SchemaRef,
        columns: Vec<DeviceColumn>,
        rows: usize,
    ) -> Result<DeviceTable, CudaError> {
        let bad = |detail: String| CudaError::Invalid {
            rank: gpu.rank(),
            detail,
        };
        if columns.len() != schema.fields().len() {
            return Err(bad(format!(
                "{} device columns for a schema of {}",
                columns.len(),
                schema.fields().len()
            )));
        }
        for (f, c) in schema.fields().iter().zip(&columns) {
            let w = device_width(f.data_type()).ok_or_else(|| {
                bad(format!(
                    "column {:?} of type {} has no device form",
                    f.name(),
                    f.data_type()
                ))
            })?;
            if c.data.len() != w * rows || c.valid.as_ref().is_some_and(|v| v.len() != rows) {
                return Err(bad(format!(
                    "column {:?}: {} value bytes for {rows} rows of {w} bytes",
                    f.name(),
                    c.data.len()
                )));
            }
        }
        Ok(DeviceTable {
            schema,
            columns: Arc::new(columns),
            rows,
        })
    }

    /// Copies a host batch to the device.
    pub fn from_batch(gpu: &Arc<Gpu>, batch: &RecordBatch) -> Result<DeviceTable, CudaError> {
        Self::from_batches(gpu, batch.schema(), std::slice::from_ref(batch))
    }

    /// Copies host batches of `schema`, one after another, to the device as
    /// one table. Each column's chunks are packed into pinned blocks, one
    /// asynchronous copy per block, so the host packs the next block while
    /// the last is on its way; where the pinned pool has no room the
    /// chunks go as pageable copies, one per chunk.
    pub fn from_batches(
        gpu: &Arc<Gpu>,
        schema: SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<DeviceTable, CudaError> {
        let bad = |detail: String| CudaError::Invalid {
            rank: gpu.rank(),
            detail,
        };
        for b in batches {
            if b.schema().fields() != schema.fields() {
                return Err(bad("host batches of different schemas".into()));
            }
        }
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        // Each column's device buffers, and its width.
        let mut columns = Vec::with_capacity(schema.fields().len());
        for (ci, f) in schema.fields().iter().enumerate() {
            let dt = f.data_type();
            let w = device_width(dt).ok_or_else(|| {
                bad(format!(
                    "column {:?} of type {dt} has no device form (only fixed-width types)",
                    f.name()
                ))
            })?;
            let data = DeviceBuffer::alloc(gpu, rows * w)?;
            data.wait_writable(gpu.stream())?;
            let any_nulls = batches.iter().any(|b| {
                b.column(ci)
                    .logical_nulls()
                    .is_some_and(|n| n.null_count() > 0)
            });
            let valid = match any_nulls {
                true => {
                    let v = DeviceBuffer::alloc(gpu, rows)?;
                    v.wait_writable(gpu.stream())?;
                    Some(v)
                }
                false => None,
            };
            columns.push((data, valid, w));
        }
        // The pieces to copy, column by column, chunk by chunk: (column,
        // chunk, first row, bytes). Consecutive pieces of one column land
        // back to back, so a filler's share packs into full blocks.
        let mut pieces = Vec::with_capacity(columns.len() * batches.len());
        for (ci, (_, valid, w)) in columns.iter().enumerate() {
            let mut at = 0usize;
            for (bi, b) in batches.iter().enumerate() {
                let n = b.num_rows();
                pieces.push((ci, bi, at, n * (w + usize::from(valid.is_some()))));
                at += n;
            }
        }
        // Packing is a host memcpy (~10 GB/s a core) and the copies run at
        // the link's speed (25-50 GB/s): large uploads are packed by up to
        // FILLERS threads, each with its own stager, over contiguous shares
        // of the pieces of about equal bytes.
        let total: usize = pieces.iter().map(|p| p.3).sum();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let fillers = (total / FILL_SHARE).clamp(1, FILLERS.min(cores));
        let mut shares: Vec<&[(usize, usize, usize, usize)]> = Vec::with_capacity(fillers);
        let mut rest = pieces.as_slice();
        let mut left = total;
        for k in (1..=fillers).rev() {
            // Pieces until this share holds about an equal part of what is left.
            let want = left / k;
            let mut got = 0;
            let mut cut = 0;
            while cut < rest.len() && (got < want || k == 1) {
                got += rest[cut].3;
                cut += 1;
            }
            let (share, tail) = rest.split_at(cut);
            shares.push(share);
            rest = tail;
            left -= got;
        }
        let fill = |share: &[(usize, usize, usize, usize)]| -> Result<(), CudaError> {
            gpu.bind()?;
            let bytes: usize = share.iter().map(|p| p.3).sum();
            let mut stager = Stager::new(gpu, bytes)?;
            for &(ci, bi, at, _) in share {
                let (data, valid, w) = &columns[ci];
                let (f, b) = (&schema.fields()[ci], &batches[bi]);
                let a = b.column(ci);
                let n = b.num_rows();
                let d = a.to_data();
                if *f.data_type() == DataType::Boolean {
                    let bits = BooleanBuffer::new(d.buffers()[0].clone(), d.offset(), n);
                    stager.push(data, at * w, &bits_to_bytes(&bits))?;
                } else {
                    let off = d.offset() * w;
                    let values = d
                        .buffers()
                        .first()
                        .and_then(|b| b.as_slice().get(off..off + n * w))
                        .ok_or_else(|| {
                            bad(format!(
                                "column {:?}: values shorter than its rows",
                                f.name()
                            ))
                        })?;
                    stager.push(data, at * w, values)?;
                }
                if let Some(v) = valid {
                    let bytes: Vec<u8> = match a.logical_nulls() {
                        Some(nb) => bits_to_bytes(nb.inner()),
                        None => vec![1; n],
                    };
                    stager.push(v, at, &bytes)?;
                }
            }
            stager.finish()
        };
        if shares.len() <= 1 {
            fill(shares.first().copied().unwrap_or(&[]))?;
        } else {
            let results: Vec<Result<(), CudaError>> = std::thread::scope(|sc| {
                let handles: Vec<_> = shares
                    .iter()
                    .map(|share| sc.spawn(move || fill(share)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(bad("a thread packing the upload panicked".into()))
                        })
                    })
                    .collect()
            });
            results
                .into_iter()
                .collect::<Result<Vec<()>, CudaError>>()?;
        }
        let columns = columns
            .into_iter()
            .map(|(mut data, mut valid, _)| {
                data.mark_complete();
                if let Some(v) = &mut valid {
                    v.mark_complete();
                }
                DeviceColumn { data, valid }
            })
            .collect();
        Ok(DeviceTable {
            schema,
            columns: Arc::new(columns),
            rows,
        })
    }

    /// Copies the table to a host batch.
    pub fn to_batch(&self) -> Result<RecordBatch, CudaError> {
        self.rows_to_batch(0, self.rows)
    }

    /// Copies rows `offset..offset + len` to a host batch (no device copy
    /// first: each column's range is read directly, in one transfer). A
    /// column of 64 KiB or more lands in a block of the device's pinned
    /// pool, which then backs the Arrow array (back to the pool when the
    /// array is dropped); smaller ones, or all once the pool is full, in
    /// fresh pageable memory. Many rows at once and then
    /// `RecordBatch::slice` is the cheap way to make many chunks: each
    /// transfer has a fixed cost.
    pub fn rows_to_batch(&self, offset: usize, len: usize) -> Result<RecordBatch, CudaError> {
        self.start_rows(offset, len)?.finish()
    }

    /// [`DeviceTable::rows_to_batch`] in two steps: this one enqueues every
    /// column's copy and returns; [`RowsInFlight::finish`] waits for them
    /// and makes the batch. Starting the next rows before finishing these
    /// overlaps their copies with the host's work on these (the copies into
    /// pinned blocks are asynchronous; pageable ones complete here).
    pub fn start_rows(&self, offset: usize, len: usize) -> Result<RowsInFlight, CudaError> {
        let first = self.columns.first().map(|c| c.data.gpu().clone());
        let rank = first.as_ref().map_or(0, |g| g.rank());
        if offset.checked_add(len).is_none_or(|e| e > self.rows) {
            return Err(CudaError::Invalid {
                rank,
                detail: format!(
                    "rows {offset}..{} of a {}-row device table",
                    offset.saturating_add(len),
                    self.rows
                ),
            });
        }
        // Every column's copies are enqueued first (into pinned blocks
        // they overlap), then waited for once.
        let mut landed = Vec::with_capacity(self.columns.len());
        let mut failed = None;
        for (f, c) in self.schema.fields().iter().zip(self.columns.iter()) {
            let w = device_width(f.data_type()).unwrap_or(0);
            let start = Landing::start(&c.data, offset * w, len * w).and_then(|values| {
                let valid = c.valid.as_ref().map(|v| Landing::start(v, offset, len));
                match valid.transpose() {
                    Ok(valid) => Ok((values, valid)),
                    Err(e) => {
                        landed.push((values, None));
                        Err(e)
                    }
                }
            });
            match start {
                Ok(l) => landed.push(l),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let pinned = landed
            .iter()
            .any(|(v, n)| v.is_pinned() || n.as_ref().is_some_and(Landing::is_pinned));
        // Every column lives on the first one's device and stream.
        let done = match (&first, pinned) {
            (Some(gpu), true) => Some(gpu.record(gpu.stream())),
            _ => None,
        };
        let mut rows = RowsInFlight {
            schema: self.schema.clone(),
            len,
            rank,
            landed,
            done: None,
        };
        match done {
            Some(Ok(ev)) => rows.done = Some(ev),
            Some(Err(e)) => {
                // No event: wait for the stream here, or never hand the
                // blocks back.
                if let Some(gpu) = &first {
                    if gpu.stream().synchronize().is_err() {
                        rows.forget();
                    }
                }
                return Err(e);
            }
            None => {}
        }
        match failed {
            // Dropping `rows` waits for the copies that did start.
            Some(e) => Err(e),
            None => Ok(rows),
        }
    }

    /// Rows `offset..offset + len` as a new table (device copies).
    pub fn slice(
        &self,
        gpu: &Arc<Gpu>,
        offset: usize,
        len: usize,
    ) -> Result<DeviceTable, CudaError> {
        DeviceTable::concat_ranges(gpu, self.schema.clone(), &[(self, offset, len)])
    }

    /// The given row ranges of tables with this schema, one after another,
    /// as one table (one device copy per column and range).
    pub fn concat_ranges(
        gpu: &Arc<Gpu>,
        schema: SchemaRef,
        parts: &[(&DeviceTable, usize, usize)],
    ) -> Result<DeviceTable, CudaError> {
        let bad = |detail: String| CudaError::Invalid {
            rank: gpu.rank(),
            detail,
        };
        let mut rows = 0usize;
        for (t, off, len) in parts {
            if t.schema.fields() != schema.fields() {
                return Err(bad(
                    "concatenating device tables of different schemas".into()
                ));
            }
            if off.checked_add(*len).is_none_or(|e| e > t.rows) {
                return Err(bad(format!(
                    "rows {off}..{} of a {}-row device table",
                    off.saturating_add(*len),
                    t.rows
                )));
            }
            rows += len;
        }
        let mut columns = Vec::with_capacity(schema.fields().len());
        for (ci, f) in schema.fields().iter().enumerate() {
            let w = device_width(f.data_type()).unwrap_or(0);
            let mut data = DeviceBuffer::alloc(gpu, rows * w)?;
            let any_nulls = parts.iter().any(|(t, _, _)| t.columns[ci].valid.is_some());
            let mut valid = if any_nulls {
                Some(DeviceBuffer::alloc(gpu, rows)?)
            } else {
                None
            };
            let mut at = 0usize;
            for (t, off, len) in parts {
                let c = &t.columns[ci];
                data.copy_region(at * w, &c.data, off * w, len * w)?;
                if let Some(v) = &mut valid {
                    match &c.valid {
                        Some(src) => v.copy_region(at, src, *off, *len)?,
                        None => fill_region(gpu, v, at, *len, 1)?,
                    }
                }
                at += len;
            }
            columns.push(DeviceColumn { data, valid });
        }
        Ok(DeviceTable {
            schema,
            columns: Arc::new(columns),
            rows,
        })
    }

    /// The columns, owned (copied on the device if the table is shared).
    pub fn into_columns(self) -> Result<Vec<DeviceColumn>, CudaError> {
        match Arc::try_unwrap(self.columns) {
            Ok(cols) => Ok(cols),
            Err(shared) => shared
                .iter()
                .map(|c| {
                    Ok(DeviceColumn {
                        data: c.data.try_clone()?,
                        valid: c.valid.as_ref().map(|v| v.try_clone()).transpose()?,
                    })
                })
                .collect(),
        }
    }

    /// Bytes per row of the packed form: every column's values plus one
    /// validity byte.
    pub fn packed_row_bytes(schema: &SchemaRef) -> usize {
        schema
            .fields()
            .iter()
            .map(|f| device_width(f.data_type()).unwrap_or(0) + 1)
            .sum()
    }

    /// Packs the table into one device buffer (for one message): per
    /// column its values, then its validity bytes (all 1 where it has
    /// none). The layout follows from the schema and the row count, so
    /// the receiver needs only the byte length.
    pub fn pack(&self, gpu: &Arc<Gpu>) -> Result<DeviceBuffer, CudaError> {
        let n = self.rows;
        let mut out = DeviceBuffer::alloc(gpu, n * Self::packed_row_bytes(&self.schema))?;
        let mut at = 0usize;
        for (f, c) in self.schema.fields().iter().zip(self.columns.iter()) {
            let w = device_width(f.data_type()).unwrap_or(0);
            out.copy_region(at, &c.data, 0, n * w)?;
            at += n * w;
            match &c.valid {
                Some(v) => out.copy_region(at, v, 0, n)?,
                None => fill_region(gpu, &mut out, at, n, 1)?,
            }
            at += n;
        }
        Ok(out)
    }

    /// The inverse of [`DeviceTable::pack`] for a table of `schema`.
    pub fn unpack(
        gpu: &Arc<Gpu>,
        schema: SchemaRef,
        packed: &DeviceBuffer,
    ) -> Result<DeviceTable, CudaError> {
        let row = Self::packed_row_bytes(&schema);
        if row == 0 || packed.len() % row != 0 {
            return Err(CudaError::Invalid {
                rank: gpu.rank(),
                detail: format!(
                    "{} packed bytes are not whole rows of {row} bytes",
                    packed.len()
                ),
            });
        }
        let n = packed.len() / row;
        let mut columns = Vec::with_capacity(schema.fields().len());
        let mut at = 0usize;
        for f in schema.fields() {
            let w = device_width(f.data_type()).unwrap_or(0);
            let mut data = DeviceBuffer::alloc(gpu, n * w)?;
            data.copy_region(0, packed, at, n * w)?;
            at += n * w;
            let mut valid = DeviceBuffer::alloc(gpu, n)?;
            valid.copy_region(0, packed, at, n)?;
            at += n;
            columns.push(DeviceColumn {
                data,
                valid: Some(valid),
            });
        }
        DeviceTable::new(gpu, schema, columns, n)
    }

    /// The schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        self.rows
    }

    /// The columns, in schema order.
    pub fn columns(&self) -> &[DeviceColumn] {
        &self.columns
    }

    /// Device bytes held (values and validity).
    pub fn size_bytes(&self) -> usize {
        self.columns
            .iter()
            .map(|c| c.data.len() + c.valid.as_ref().map_or(0, |v| v.len()))
            .sum()
    }
}

/// Rows of a device table on their way to the host
/// ([`DeviceTable::start_rows`]): every column's copy enqueued, the batch
/// not made yet. Dropped unfinished, it waits for its copies (the pinned
/// blocks they write must not go back to the pool before).
pub struct RowsInFlight {
    schema: SchemaRef,
    len: usize,
    rank: crate::Rank,
    /// Per column: its values, and its validity bytes where it has them.
    landed: Vec<(Landing, Option<Landing>)>,
    /// Recorded after the copies into pinned blocks (none: no such copy).
    done: Option<GpuEvent>,
}

impl RowsInFlight {
    /// Rows in flight.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no rows are in flight.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Leaks the blocks: copies may still be writing them.
    fn forget(&mut self) {
        std::mem::forget(std::mem::take(&mut self.landed));
    }

    /// Waits for the copies; on a failed wait the blocks are leaked, never
    /// handed back.
    fn wait(&mut self) -> Result<(), CudaError> {
        if let Some(ev) = self.done.take() {
            if let Err(e) = ev.synchronize(self.rank) {
                self.forget();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Waits for the copies and makes the batch: pinned blocks become the
    /// Arrow buffers themselves, validity bytes become bitmaps.
    pub fn finish(mut self) -> Result<RecordBatch, CudaError> {
        self.wait()?;
        let len = self.len;
        let rank = self.rank;
        let landed = std::mem::take(&mut self.landed);
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(landed.len());
        for (f, (values, valid)) in self.schema.fields().iter().zip(landed) {
            let dt = f.data_type().clone();
            let w = device_width(&dt).unwrap_or(0);
            let nulls = valid.map(|v| NullBuffer::new(bytes_to_bits(v.bytes(len))));
            let values = if dt == DataType::Boolean {
                bytes_to_bits(values.bytes(len)).into_inner()
            } else {
                values.into_buffer(len * w)
            };
            let data = ArrayData::builder(dt)
                .len(len)
                .add_buffer(values)
                .nulls(nulls)
                .build()
                .map_err(|e| CudaError::Invalid {
                    rank,
                    detail: format!("column {:?} back to Arrow: {e}", f.name()),
                })?;
            arrays.push(make_array(data));
        }
        RecordBatch::try_new(self.schema.clone(), arrays).map_err(|e| CudaError::Invalid {
            rank,
            detail: format!("device table back to Arrow: {e}"),
        })
    }
}

impl Drop for RowsInFlight {
    fn drop(&mut self) {
        let _ = self.wait();
    }
}

/// Copies of this size and up go through a pinned block (smaller ones are
/// not worth a block of [`MIN_BLOCK`](super::pinned::MIN_BLOCK) bytes).
const PINNED_FROM: usize = 64 << 10;

/// Where a column's downloaded bytes land.
enum Landing {
    /// A pinned block, written asynchronously; valid once the stream is
    /// synchronised.
    Pinned(PinnedBlock),
    /// Pageable memory, written before `start` returned.
    Words(Vec<u64>),
}

impl Landing {
    /// Starts copying `len` bytes from `offset` of `buf` to the host: into
    /// a pinned block (enqueued only) when the copy is large enough and the
    /// pool has room, else into pageable memory (done on return).
    fn start(buf: &DeviceBuffer, offset: usize, len: usize) -> Result<Landing, CudaError> {
        if len >= PINNED_FROM {
            let gpu = buf.gpu();
            if let Some(block) = gpu.pinned().take(gpu.rank(), len)? {
                // SAFETY: the block holds at least `len` bytes, and it is
                // neither read nor dropped before the stream is synchronised
                // (`rows_to_batch` forgets it when that fails).
                unsafe { buf.enqueue_read(offset, block.as_ptr().as_ptr(), len) }?;
                return Ok(Landing::Pinned(block));
            }
        }
        buf.read_words(offset, len).map(Landing::Words)
    }

    fn is_pinned(&self) -> bool {
        matches!(self, Landing::Pinned(_))
    }

    /// The first `len` bytes (after the copy completed).
    fn bytes(&self, len: usize) -> &[u8] {
        match self {
            // SAFETY: the copy wrote `len` bytes of the block and completed
            // (the stream was synchronised); the borrow keeps the block.
            Landing::Pinned(b) => unsafe { std::slice::from_raw_parts(b.as_ptr().as_ptr(), len) },
            Landing::Words(w) => &bytemuck::cast_slice(w)[..len],
        }
    }

    /// The first `len` bytes as an Arrow buffer, without a copy: a pinned
    /// block goes back to its pool when the last array using it is dropped.
    fn into_buffer(self, len: usize) -> Buffer {
        match self {
            Landing::Pinned(b) => {
                let ptr = b.as_ptr();
                // SAFETY: the block holds `len` initialised bytes (the copy
                // completed) at `ptr`, and the buffer owns the block, so the
                // memory lives as long as the buffer.
                unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(b)) }
            }
            Landing::Words(w) => {
                let mut b = Buffer::from_vec(w);
                if b.len() != len {
                    b = b.slice_with_length(0, len);
                }
                b
            }
        }
    }
}

/// Eight bytes (0 = false, anything else true) to eight bits, byte `k` to
/// bit `k`: each byte's bits are ORed into its lowest bit, and one
/// multiplication gathers the eight lowest bits into the top byte.
fn pack8(x: u64) -> u64 {
    let mut t = x | (x >> 4);
    t |= t >> 2;
    t |= t >> 1;
    (t & 0x0101_0101_0101_0101).wrapping_mul(0x0102_0408_1020_4080) >> 56
}

/// Eight bits to eight bytes of 0 or 1, bit `k` to byte `k`.
fn spread8(b: u64) -> u64 {
    let x = (b & 0xff).wrapping_mul(0x0101_0101_0101_0101) & 0x8040_2010_0804_0201;
    // A byte holding its one bit (at most 0x80) plus 0x7f carries into
    // its top bit exactly when it is not zero, and never into the next.
    ((x + 0x7f7f_7f7f_7f7f_7f7f) >> 7) & 0x0101_0101_0101_0101
}

/// Validity or boolean bytes (the device form) as Arrow bits, 64 rows a
/// word: about six times as fast as `BooleanBuffer::collect_bool` over
/// the bytes (0.17 against 1.1 ns a row on the 2-core VM of 2026-11-27),
/// which matters at seven validity columns of 100M rows.
fn bytes_to_bits(bytes: &[u8]) -> BooleanBuffer {
    let word = |c: &[u8; 64]| {
        c.chunks_exact(8).enumerate().fold(0u64, |w, (k, b)| {
            // Always 8 bytes (chunks_exact), so the default never shows.
            let e: [u8; 8] = b.try_into().unwrap_or_default();
            w | pack8(u64::from_le_bytes(e)) << (8 * k)
        })
    };
    let mut out = MutableBuffer::new(bytes.len().div_ceil(64) * 8);
    let mut chunks = bytes.chunks_exact(64);
    for c in &mut chunks {
        out.push(word(c.try_into().unwrap_or(&[0; 64])));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut last = [0u8; 64];
        last[..rest.len()].copy_from_slice(rest);
        out.push(word(&last));
    }
    BooleanBuffer::new(out.into(), 0, bytes.len())
}

/// Arrow bits as bytes of 0 or 1 (the device form), 8 rows a step (0.15
/// ns a row where iterating the bits took 0.8-0.9 on that VM).
fn bits_to_bytes(bits: &BooleanBuffer) -> Vec<u8> {
    let mut out: Vec<u8> = Vec::with_capacity(bits.len().div_ceil(64) * 64);
    for w in bits.bit_chunks().iter_padded() {
        for k in 0..8 {
            out.extend_from_slice(&spread8(w >> (8 * k)).to_le_bytes());
        }
    }
    out.truncate(bits.len());
    out
}

/// Bytes of each pinned block [`Stager`] packs host chunks into.
const STAGE_BYTES: usize = 8 << 20;
/// Most threads that pack one upload ([`DeviceTable::from_batches`]).
const FILLERS: usize = 4;
/// Bytes of upload per packing thread, at least.
const FILL_SHARE: usize = 16 << 20;

/// A pinned block being filled, and the copy that last read it.
struct Stage {
    block: Option<PinnedBlock>,
    /// Bytes packed so far.
    fill: usize,
    /// The device address byte 0 of the block goes to.
    dst: u64,
    /// The allocation `dst` lies in: one copy never spans two, even
    /// where two allocations happen to be adjacent (the driver refuses it).
    alloc: u64,
    /// The copy that last read the block (waited for before refilling).
    busy: Option<GpuEvent>,
}

/// Host bytes to device memory through two pinned blocks in turn: bytes
/// for consecutive addresses of one device buffer gather in a block, which goes as one
/// asynchronous copy when it is full (or the next bytes go elsewhere), while
/// the other block fills. Without pinned blocks each push is a pageable
/// copy. Copies go on the `Gpu`'s stream; callers make it wait for the
/// destinations first, and [`Stager::finish`] waits for every copy.
struct Stager {
    gpu: Arc<Gpu>,
    stages: Vec<Stage>,
    cur: usize,
}

impl Stager {
    /// A stager for about `bytes` bytes in all: blocks of up to
    /// [`STAGE_BYTES`], none (pageable copies) below [`PINNED_FROM`].
    fn new(gpu: &Arc<Gpu>, bytes: usize) -> Result<Stager, CudaError> {
        let mut stages = Vec::new();
        let block = bytes.min(STAGE_BYTES);
        for _ in 0..2 {
            if bytes < PINNED_FROM {
                break;
            }
            match gpu.pinned().take(gpu.rank(), block)? {
                Some(b) => stages.push(Stage {
                    block: Some(b),
                    fill: 0,
                    dst: 0,
                    alloc: 0,
                    busy: None,
                }),
                None => {
                    stages.clear();
                    break;
                }
            }
        }
        Ok(Stager {
            gpu: gpu.clone(),
            stages,
            cur: 0,
        })
    }

    /// Queues `bytes` for `dst` from byte `at` (the range checked here).
    fn push(&mut self, dst: &DeviceBuffer, at: usize, mut bytes: &[u8]) -> Result<(), CudaError> {
        let rank = self.gpu.rank();
        if at.checked_add(bytes.len()).is_none_or(|e| e > dst.len()) {
            return Err(CudaError::Invalid {
                rank,
                detail: format!(
                    "write of {} bytes at {at} of a {}-byte device buffer",
                    bytes.len(),
                    dst.len()
                ),
            });
        }
        let mut addr = dst.ptr() + at as u64;
        let alloc = dst.allocation().0;
        if self.stages.is_empty() {
            self.gpu.bind()?;
            if !bytes.is_empty() {
                // SAFETY: the range lies inside `dst` (checked above); the
                // copy from pageable memory has read `bytes` on return.
                unsafe { result::memcpy_htod_async(addr, bytes, self.gpu.stream().cu_stream()) }
                    .map_err(|e| {
                        CudaError::driver(rank, "cuMemcpyHtoDAsync", e).with_context(|| {
                            format!(
                                "{} pageable bytes to byte {at} of a {}-byte device buffer",
                                bytes.len(),
                                dst.len()
                            )
                        })
                    })?;
            }
            return Ok(());
        }
        while !bytes.is_empty() {
            let s = &mut self.stages[self.cur];
            if s.fill > 0 && (s.alloc != alloc || s.dst + s.fill as u64 != addr) {
                self.flush()?;
                continue;
            }
            if s.fill == 0 {
                if let Some(ev) = s.busy.take() {
                    ev.synchronize(rank)?;
                }
                s.dst = addr;
                s.alloc = alloc;
            }
            let Some(block) = s.block.as_mut() else {
                return Err(CudaError::Invalid {
                    rank,
                    detail: "a staging block was lost".into(),
                });
            };
            let room = &mut block.as_mut_slice()[s.fill..];
            let n = room.len().min(bytes.len());
            room[..n].copy_from_slice(&bytes[..n]);
            s.fill += n;
            addr += n as u64;
            bytes = &bytes[n..];
            if n == room.len() {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Sends the current block's bytes and moves to the next block.
    fn flush(&mut self) -> Result<(), CudaError> {
        let rank = self.gpu.rank();
        let stream = self.gpu.stream().clone();
        let Some(s) = self.stages.get_mut(self.cur) else {
            return Ok(());
        };
        if s.fill == 0 {
            return Ok(());
        }
        let Some(block) = s.block.as_ref() else {
            return Ok(());
        };
        // The copy is for the stream's context, whatever this thread had.
        self.gpu.bind()?;
        // SAFETY: the block holds `fill` packed bytes and is not refilled
        // or released before the copy's event (`busy`) completes; `dst` is
        // a checked range of a live device buffer.
        unsafe {
            cudarc::driver::sys::cuMemcpyHtoDAsync_v2(
                s.dst,
                block.as_ptr().as_ptr().cast(),
                s.fill,
                stream.cu_stream(),
            )
        }
        .result()
        .map_err(|e| {
            CudaError::driver(rank, "cuMemcpyHtoDAsync", e).with_context(|| {
                format!(
                    "{} bytes of a {}-byte pinned staging block to device address {:#x}",
                    s.fill,
                    block.size(),
                    s.dst
                )
            })
        })?;
        s.busy = Some(self.gpu.record(&stream)?);
        s.fill = 0;
        self.cur = (self.cur + 1) % self.stages.len();
        Ok(())
    }

    /// Sends what is left and waits for every copy.
    fn finish(mut self) -> Result<(), CudaError> {
        self.flush()?;
        let rank = self.gpu.rank();
        self.gpu
            .stream()
            .synchronize()
            .map_err(|e| CudaError::driver(rank, "cuStreamSynchronize", e))
    }
}

impl Drop for Stager {
    fn drop(&mut self) {
        // A block goes back to the pool only once no copy reads it.
        for s in &mut self.stages {
            if let Some(ev) = s.busy.take() {
                if ev.synchronize(self.gpu.rank()).is_err() {
                    std::mem::forget(s.block.take());
                }
            }
        }
    }
}

/// Sets `len` bytes of `buf` from `at` to `value`.
fn fill_region(
    gpu: &Arc<Gpu>,
    buf: &mut DeviceBuffer,
    at: usize,
    len: usize,
    value: u8,
) -> Result<(), CudaError> {
    if len == 0 {
        return Ok(());
    }
    let mut ones = DeviceBuffer::alloc(gpu, len)?;
    ones.fill(value)?;
    buf.copy_region(at, &ones, 0, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(s: &mut u64) -> u64 {
        *s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *s >> 33
    }

    #[test]
    fn bits_and_bytes_convert_like_arrow() {
        let mut s = 7u64;
        // Any non-zero byte is true, not only 1.
        let bytes: Vec<u8> = (0..5000)
            .map(|_| match lcg(&mut s) % 4 {
                0 => 0,
                1 => 1,
                _ => (lcg(&mut s) % 255 + 1) as u8,
            })
            .collect();
        for len in [0usize, 1, 7, 8, 9, 63, 64, 65, 127, 1000, 5000] {
            let b = &bytes[..len];
            let bits = bytes_to_bits(b);
            assert_eq!(
                bits,
                BooleanBuffer::collect_bool(len, |i| b[i] != 0),
                "{len}"
            );
            let want: Vec<u8> = b.iter().map(|&x| u8::from(x != 0)).collect();
            assert_eq!(bits_to_bytes(&bits), want, "{len}");
            // At a bit offset inside a word, as sliced arrays have.
            if len > 10 {
                let sl = bits.slice(3, len - 10);
                let want: Vec<u8> = sl.iter().map(u8::from).collect();
                assert_eq!(bits_to_bytes(&sl), want, "{len} sliced");
            }
        }
    }
}
