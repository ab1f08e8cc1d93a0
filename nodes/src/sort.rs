//! Distributed sort (sample sort): afterwards rank r holds a sorted run of
//! the table and every key on rank r sorts before every key on rank r+1.
//!
//! ```text
//!   1. each rank samples its rows' keys (evenly spaced, at most S of them)
//!   2. AllGather of the samples; every rank sorts them the same way and
//!      picks the N-1 splitters at the N-quantiles
//!   3. each row goes to the rank of its range (equal keys never split:
//!      the destination depends on the key alone)
//!   4. Shuffle (streams, spills over the memory limit), then a local sort
//! ```
//!
//! Cost: one small AllGather (N*S keys), one shuffle of the table, and an
//! O(n log n) local sort. Skew: a key that repeats more than n/N times makes
//! its rank larger than the others (the price of never splitting keys).

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_ord::sort::{SortColumn, lexsort_to_indices};
use arrow_schema::{SchemaRef, SortOptions};
use arrow_select::concat::concat_batches;
use arrow_select::take::take_record_batch;
use braid_coll::{AllGather, ExtractOrder};
use braid_core::{Buffer, Context, PackedData};

use crate::error::{DataError, Result};
use crate::partition::{column_index, converter, key_rows, range_partition};
use crate::shuffle::TableShuffle;

/// One sort key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortKey {
    /// Column name.
    pub column: String,
    /// Largest first.
    pub descending: bool,
    /// Nulls before values.
    pub nulls_first: bool,
}

impl SortKey {
    /// Ascending, nulls last.
    pub fn asc(column: impl Into<String>) -> Self {
        SortKey {
            column: column.into(),
            descending: false,
            nulls_first: false,
        }
    }

    fn options(&self) -> SortOptions {
        SortOptions {
            descending: self.descending,
            nulls_first: self.nulls_first,
        }
    }
}

fn resolve(schema: &arrow_schema::Schema, keys: &[SortKey]) -> Result<Vec<(usize, SortOptions)>> {
    keys.iter()
        .map(|k| Ok((column_index(schema, &k.column)?, k.options())))
        .collect()
}

/// Sorts one batch locally by `keys`. One key: Arrow's sort kernel; several:
/// a sort of row indices by the keys' row format (one memcmp per
/// comparison, no per-column dispatch).
pub fn local_sort(batch: &RecordBatch, keys: &[SortKey]) -> Result<RecordBatch> {
    if batch.num_rows() <= 1 {
        return Ok(batch.clone());
    }
    let resolved = resolve(batch.schema_ref(), keys)?;
    let idx = if resolved.len() == 1 {
        let cols = resolved
            .into_iter()
            .map(|(i, o)| SortColumn {
                values: batch.column(i).clone(),
                options: Some(o),
            })
            .collect::<Vec<_>>();
        lexsort_to_indices(&cols, None)?
    } else {
        let conv = converter(batch.schema_ref(), &resolved)?;
        let rows = key_rows(&conv, batch, &resolved)?;
        let mut ix: Vec<u32> = (0..batch.num_rows() as u32).collect();
        ix.sort_unstable_by(|a, b| rows.row(*a as usize).cmp(&rows.row(*b as usize)));
        arrow_array::UInt32Array::from(ix)
    };
    Ok(take_record_batch(batch, &idx)?)
}

/// The values of an integer-like column (int64, timestamp, date, smaller
/// ints) as i64, if it has that type and no nulls.
pub(crate) fn int_key(a: &arrow_array::ArrayRef) -> Option<std::borrow::Cow<'_, [i64]>> {
    use arrow_array::Array;
    use arrow_schema::DataType::*;
    if a.null_count() > 0 {
        return None;
    }
    match a.data_type() {
        Int64 | Timestamp(..) | Date64 | Time64(_) | Duration(_) => {
            let d = a.to_data();
            let b = d.buffers().first()?;
            let all: &[i64] = b.typed_data();
            let v = all.get(d.offset()..d.offset() + d.len())?.to_vec();
            Some(std::borrow::Cow::Owned(v))
        }
        Int8 | Int16 | Int32 | UInt8 | UInt16 | UInt32 | Date32 => {
            let c = arrow_cast::cast(a, &Int64).ok()?;
            let v = c
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>()?
                .values()
                .to_vec();
            Some(std::borrow::Cow::Owned(v))
        }
        _ => None,
    }
}

/// Sorts the rows of several batches into one batch without first
/// concatenating them. Fast path, for one or two ascending integer-like keys
/// without nulls: a sort of (key, key, batch, row) tuples, then one gather.
/// Otherwise: concatenate, then [`local_sort`].
pub fn sort_parts(
    schema: &SchemaRef,
    parts: Vec<RecordBatch>,
    keys: &[SortKey],
) -> Result<RecordBatch> {
    if parts.is_empty() {
        return Ok(RecordBatch::new_empty(schema.clone()));
    }
    if (1..=2).contains(&keys.len()) && keys.iter().all(|k| !k.descending) {
        let cols: Vec<usize> = keys
            .iter()
            .map(|k| column_index(schema, &k.column))
            .collect::<Result<_>>()?;
        let total: usize = parts.iter().map(|p| p.num_rows()).sum();
        let mut tuples: Vec<(i64, i64, u32, u32)> = Vec::with_capacity(total);
        let mut ok = true;
        for (bi, p) in parts.iter().enumerate() {
            let k0 = int_key(p.column(cols[0]));
            let k1 = match cols.get(1) {
                Some(c) => int_key(p.column(*c)).map(Some),
                None => Some(None),
            };
            let (Some(a), Some(b)) = (k0, k1) else {
                ok = false;
                break;
            };
            for (ri, x) in a.iter().enumerate() {
                let y = b.as_ref().map(|b| b[ri]).unwrap_or(0);
                tuples.push((*x, y, bi as u32, ri as u32));
            }
        }
        if ok {
            tuples.sort_unstable();
            let idx: Vec<(usize, usize)> = tuples
                .iter()
                .map(|t| (t.2 as usize, t.3 as usize))
                .collect();
            drop(tuples);
            let refs: Vec<&RecordBatch> = parts.iter().collect();
            return Ok(arrow_select::interleave::interleave_record_batch(
                &refs, &idx,
            )?);
        }
    }
    let all = concat_batches(schema, &parts)?;
    drop(parts);
    local_sort(&all, keys)
}

/// A distributed sort by `keys`.
#[derive(Debug, Clone)]
pub struct DistributedSort {
    /// The sort keys, most significant first.
    pub keys: Vec<SortKey>,
    /// Samples per rank (more: better balance, bigger AllGather).
    pub samples_per_rank: usize,
}

impl DistributedSort {
    /// A sort by `keys` with the default sample size.
    pub fn new(keys: Vec<SortKey>) -> Self {
        DistributedSort {
            keys,
            samples_per_rank: 1024,
        }
    }

    /// Sorts the table whose local part is `batches`; returns this rank's
    /// sorted partition.
    pub async fn sort(
        &self,
        ctx: &Context,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Result<RecordBatch> {
        let n = ctx.nranks() as usize;
        let keys = resolve(&schema, &self.keys)?;
        if n == 1 {
            let (schema, sk) = (schema.clone(), self.keys.clone());
            return tokio::task::spawn_blocking(move || sort_parts(&schema, batches, &sk))
                .await
                .map_err(|e| DataError::Invalid(e.to_string()))?;
        }
        // 1. Sample.
        let conv = Arc::new(converter(&schema, &keys)?);
        let total: usize = batches.iter().map(|b| b.num_rows()).sum();
        let want = self.samples_per_rank.min(total);
        let (c2, k2, b2) = (conv.clone(), keys.clone(), batches.clone());
        let (lens, bytes) = tokio::task::spawn_blocking(move || -> Result<(Vec<u8>, Vec<u8>)> {
            let mut lens = Vec::new();
            let mut bytes = Vec::new();
            if want == 0 {
                return Ok((lens, bytes));
            }
            let step = total as f64 / want as f64;
            let mut next = 0.0f64;
            let mut base = 0usize;
            for b in &b2 {
                let rows = key_rows(&c2, b, &k2)?;
                while (next as usize) < base + b.num_rows() && lens.len() / 4 < want {
                    let r = rows.row(next as usize - base);
                    lens.extend_from_slice(&(r.as_ref().len() as u32).to_le_bytes());
                    bytes.extend_from_slice(r.as_ref());
                    next += step;
                }
                base += b.num_rows();
            }
            Ok((lens, bytes))
        })
        .await
        .map_err(|e| DataError::Invalid(e.to_string()))??;
        // 2. Gather samples; pick splitters (the same on every rank).
        let ag = AllGather::new(ctx, None);
        ag.insert(
            0,
            PackedData {
                metadata: bytes::Bytes::from(lens),
                data: Buffer::from_vec(bytes),
            },
        )?;
        ag.insert_finished()?;
        let mut samples: Vec<Vec<u8>> = Vec::new();
        for g in ag.extract(ExtractOrder::RankSeq).await? {
            let (lens, data) = (g.data.metadata, g.data.data);
            let mut off = 0usize;
            for l in lens.chunks_exact(4) {
                let l = u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize;
                let s = data
                    .as_slice()
                    .get(off..off + l)
                    .ok_or_else(|| DataError::Invalid("malformed sample from a peer".into()))?;
                samples.push(s.to_vec());
                off += l;
            }
        }
        samples.sort_unstable();
        let splitters: Vec<Vec<u8>> = if samples.is_empty() {
            Vec::new()
        } else {
            (1..n)
                .map(|k| samples[k * samples.len() / n].clone())
                .collect()
        };
        // 3 + 4. Partition, shuffle, sort locally. This rank's own range
        // stays as batches (no packing, no copy).
        let mut shuffle = TableShuffle::new(ctx);
        for b in batches {
            let (c2, k2, s2) = (conv.clone(), keys.clone(), splitters.clone());
            shuffle
                .insert(move || range_partition(&b, &c2, &k2, &s2))
                .await?;
        }
        let parts = shuffle.finish().await?;
        let sk = self.keys.clone();
        tokio::task::spawn_blocking(move || sort_parts(&schema, parts, &sk))
            .await
            .map_err(|e| DataError::Invalid(e.to_string()))?
    }
}
