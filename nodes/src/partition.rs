//! Partitioning record batches: by a hash of key columns, or by ranges
//! between sorted splitters. Keys are compared and hashed in Arrow's row
//! format, so any column types, several columns, descending order and null
//! placement all work the same way. Equal keys always land in the same
//! partition.

use arrow_array::{ArrayRef, RecordBatch, UInt32Array};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::SortOptions;
use arrow_select::take::take_record_batch;

use crate::error::{DataError, Result};

/// A 64-bit hash of bytes, the same on every rank and process.
pub fn hash_bytes(b: &[u8]) -> u64 {
    let mut h: u64 = 0x243f_6a88_85a3_08d3 ^ (b.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 32;
    }
    let mut w = [0u8; 8];
    let rest = chunks.remainder();
    w[..rest.len()].copy_from_slice(rest);
    h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 29)
}

/// Index of the named column, or a clear error.
pub fn column_index(batch_schema: &arrow_schema::Schema, name: &str) -> Result<usize> {
    batch_schema
        .index_of(name)
        .map_err(|_| DataError::MissingColumn {
            name: name.to_string(),
            available: batch_schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// A row converter for the given key columns with their sort options.
pub fn converter(
    batch_schema: &arrow_schema::Schema,
    keys: &[(usize, SortOptions)],
) -> Result<RowConverter> {
    let fields = keys
        .iter()
        .map(|(i, o)| SortField::new_with_options(batch_schema.field(*i).data_type().clone(), *o))
        .collect();
    Ok(RowConverter::new(fields)?)
}

/// The key columns of `batch` in row format.
pub fn key_rows(
    conv: &RowConverter,
    batch: &RecordBatch,
    keys: &[(usize, SortOptions)],
) -> Result<Rows> {
    let cols: Vec<ArrayRef> = keys.iter().map(|(i, _)| batch.column(*i).clone()).collect();
    Ok(conv.convert_columns(&cols)?)
}

/// Splits `batch` into `nparts` batches by `dest[i]` (row i's partition).
pub fn split_by(batch: &RecordBatch, dest: &[u32], nparts: usize) -> Result<Vec<RecordBatch>> {
    let mut counts = vec![0usize; nparts];
    for d in dest {
        counts[*d as usize] += 1;
    }
    let mut idx: Vec<Vec<u32>> = counts.iter().map(|c| Vec::with_capacity(*c)).collect();
    for (i, d) in dest.iter().enumerate() {
        idx[*d as usize].push(i as u32);
    }
    idx.into_iter()
        .map(|ix| {
            if ix.len() == batch.num_rows() {
                return Ok(batch.clone());
            }
            Ok(take_record_batch(batch, &UInt32Array::from(ix))?)
        })
        .collect()
}

/// Hash partitioning on the key columns: row i goes to
/// `hash(key_i) % nparts`.
pub fn hash_partition(
    batch: &RecordBatch,
    key_cols: &[usize],
    nparts: usize,
) -> Result<Vec<RecordBatch>> {
    let keys: Vec<(usize, SortOptions)> = key_cols
        .iter()
        .map(|i| (*i, SortOptions::default()))
        .collect();
    let conv = converter(batch.schema_ref(), &keys)?;
    let rows = key_rows(&conv, batch, &keys)?;
    let dest: Vec<u32> = (0..rows.num_rows())
        .map(|i| (hash_bytes(rows.row(i).as_ref()) % nparts as u64) as u32)
        .collect();
    split_by(batch, &dest, nparts)
}

/// Range partitioning: row i goes to the number of splitters below its key
/// (splitters sorted, in the converter's row format). `splitters.len() + 1`
/// partitions.
pub fn range_partition(
    batch: &RecordBatch,
    conv: &RowConverter,
    keys: &[(usize, SortOptions)],
    splitters: &[Vec<u8>],
) -> Result<Vec<RecordBatch>> {
    let rows = key_rows(conv, batch, keys)?;
    let dest: Vec<u32> = (0..rows.num_rows())
        .map(|i| {
            let r = rows.row(i);
            splitters.partition_point(|s| s.as_slice() < r.as_ref()) as u32
        })
        .collect();
    split_by(batch, &dest, splitters.len() + 1)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};

    use super::*;

    #[test]
    fn equal_keys_share_a_partition() {
        let b = RecordBatch::try_from_iter([
            (
                "k",
                Arc::new(StringArray::from(vec!["a", "b", "a", "c", "b", "a"])) as ArrayRef,
            ),
            (
                "v",
                Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5, 6])) as ArrayRef,
            ),
        ])
        .unwrap();
        let parts = hash_partition(&b, &[0], 3).unwrap();
        assert_eq!(parts.iter().map(|p| p.num_rows()).sum::<usize>(), 6);
        for p in &parts {
            let ks = p.column(0).as_any().downcast_ref::<StringArray>().unwrap();
            for k in ["a", "b", "c"] {
                let here = ks.iter().filter(|x| *x == Some(k)).count();
                let total = ["a", "b", "a", "c", "b", "a"]
                    .iter()
                    .filter(|x| **x == k)
                    .count();
                assert!(here == 0 || here == total, "key {k} split");
            }
        }
    }

    #[test]
    fn range_partition_by_splitters() {
        let b = RecordBatch::try_from_iter([(
            "t",
            Arc::new(Int64Array::from(vec![5, 1, 9, 5, 3])) as ArrayRef,
        )])
        .unwrap();
        let keys = [(0usize, SortOptions::default())];
        let conv = converter(b.schema_ref(), &keys).unwrap();
        let split_rows = conv
            .convert_columns(&[Arc::new(Int64Array::from(vec![3, 5])) as ArrayRef])
            .unwrap();
        let splitters: Vec<Vec<u8>> = (0..2)
            .map(|i| split_rows.row(i).as_ref().to_vec())
            .collect();
        let parts = range_partition(&b, &conv, &keys, &splitters).unwrap();
        let vals = |p: &RecordBatch| -> Vec<i64> {
            p.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        };
        assert_eq!(vals(&parts[0]), vec![1, 3]);
        assert_eq!(vals(&parts[1]), vec![5, 5]);
        assert_eq!(vals(&parts[2]), vec![9]);
    }
}
