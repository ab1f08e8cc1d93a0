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
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer};
use arrow_data::ArrayData;
use arrow_schema::{DataType, SchemaRef};

use super::buffer::DeviceBuffer;
use super::device::Gpu;
use super::error::CudaError;

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
        let rows = batch.num_rows();
        let schema = batch.schema();
        let mut columns = Vec::with_capacity(batch.num_columns());
        for (f, a) in schema.fields().iter().zip(batch.columns()) {
            let dt = f.data_type();
            let w = device_width(dt).ok_or_else(|| CudaError::Invalid {
                rank: gpu.rank(),
                detail: format!(
                    "column {:?} of type {dt} has no device form (only fixed-width types)",
                    f.name()
                ),
            })?;
            let data = a.to_data();
            let bytes: Vec<u8>;
            let values: &[u8] = if *dt == DataType::Boolean {
                let b = BooleanBuffer::new(data.buffers()[0].clone(), data.offset(), rows);
                bytes = b.iter().map(u8::from).collect();
                &bytes
            } else {
                let off = data.offset() * w;
                data.buffers()
                    .first()
                    .and_then(|b| b.as_slice().get(off..off + rows * w))
                    .ok_or_else(|| CudaError::Invalid {
                        rank: gpu.rank(),
                        detail: format!("column {:?}: values shorter than its rows", f.name()),
                    })?
            };
            let valid = match a.logical_nulls() {
                Some(n) if n.null_count() > 0 => {
                    let v: Vec<u8> = n.iter().map(u8::from).collect();
                    Some(DeviceBuffer::from_host(gpu, &v)?)
                }
                _ => None,
            };
            columns.push(DeviceColumn {
                data: DeviceBuffer::from_host(gpu, values)?,
                valid,
            });
        }
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
    /// first: each column's range is read directly).
    pub fn rows_to_batch(&self, offset: usize, len: usize) -> Result<RecordBatch, CudaError> {
        if offset.checked_add(len).is_none_or(|e| e > self.rows) {
            return Err(CudaError::Invalid {
                rank: self.columns.first().map_or(0, |c| c.data.gpu().rank()),
                detail: format!(
                    "rows {offset}..{} of a {}-row device table",
                    offset.saturating_add(len),
                    self.rows
                ),
            });
        }
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.columns.len());
        for (f, c) in self.schema.fields().iter().zip(self.columns.iter()) {
            let rank = c.data.gpu().rank();
            let dt = f.data_type().clone();
            let w = device_width(&dt).unwrap_or(0);
            // Read into u64 words so that the buffer is aligned for any type.
            let mut words = vec![0u64; (len * w).div_ceil(8)];
            c.data.read_at(
                offset * w,
                &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..len * w],
            )?;
            let nulls = match &c.valid {
                Some(v) => {
                    let mut bytes = vec![0u8; len];
                    v.read_at(offset, &mut bytes)?;
                    // Packed 64 rows a word (collecting an iterator packs
                    // one bit at a time).
                    Some(NullBuffer::new(BooleanBuffer::collect_bool(len, |i| {
                        bytes[i] != 0
                    })))
                }
                None => None,
            };
            let values = if dt == DataType::Boolean {
                let bytes: &[u8] = bytemuck::cast_slice(&words);
                BooleanBuffer::collect_bool(len, |i| bytes[i] != 0).into_inner()
            } else {
                Buffer::from_vec(words)
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
            rank: self.columns.first().map_or(0, |c| c.data.gpu().rank()),
            detail: format!("device table back to Arrow: {e}"),
        })
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
