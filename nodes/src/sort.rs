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
//! Cost: one small AllGather (N*S keys), one shuffle of the table, and a
//! local sort: for one or two integer-like keys without nulls (the rolling
//! job's order and group columns) a stable LSD radix sort of the keys
//! (`braid_kernels::sort`, one pass per key byte that varies) and one
//! prefetching gather per fixed-width column; otherwise Arrow's O(n log n)
//! sort. Skew: a key that repeats more than n/N times makes
//! its rank larger than the others (the price of never splitting keys).
//!
//! Order: Arrow's, but float keys compare as DuckDB's `ORDER BY` and
//! Polars' `sort` do (`partition::order_key_column`): -0.0 ties with 0.0
//! and every NaN sorts above +inf (after the values ascending, first
//! descending); nulls where each key's `nulls_first` puts them.

use std::sync::{Arc, OnceLock};

use arrow_array::{Array, ArrayRef, RecordBatch, make_array};
use arrow_buffer::{ArrowNativeType, BooleanBufferBuilder, NullBuffer, ScalarBuffer};
use arrow_data::ArrayData;
use arrow_ord::sort::{SortColumn, lexsort_to_indices};
use arrow_schema::{SchemaRef, SortOptions};
use arrow_select::concat::concat_batches;
use arrow_select::take::take_record_batch;
use braid_coll::{AllGather, ExtractOrder};
use braid_core::{Buffer, Context, PackedData, Rank};
use braid_kernels::sort::{gather_packed, order_key, radix_sort_pairs_on, unpack_row};

use crate::error::{DataError, Result};
use crate::partition::{
    Splitters, check_columns, column_index, converter, key_rows, order_key_column, range_partition,
};
use crate::shuffle::TableShuffle;
use crate::threads::{map_scoped, rank_threads};

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

/// The key columns' indices and options; no keys is an error (an order
/// of nothing is not one the caller meant, and the row format of no
/// columns has no rows to compare).
fn resolve(schema: &arrow_schema::Schema, keys: &[SortKey]) -> Result<Vec<(usize, SortOptions)>> {
    if keys.is_empty() {
        return Err(DataError::Invalid(
            "a sort needs at least one key column".into(),
        ));
    }
    keys.iter()
        .map(|k| Ok((column_index(schema, &k.column)?, k.options())))
        .collect()
}

/// Sorts one batch locally by `keys`. One key: Arrow's sort kernel; several:
/// a sort of row indices by the keys' row format (one memcmp per
/// comparison, no per-column dispatch).
pub fn local_sort(batch: &RecordBatch, keys: &[SortKey]) -> Result<RecordBatch> {
    let resolved = resolve(batch.schema_ref(), keys)?;
    if batch.num_rows() <= 1 {
        return Ok(batch.clone());
    }
    let idx = if resolved.len() == 1 {
        let cols = resolved
            .into_iter()
            .map(|(i, o)| {
                Ok(SortColumn {
                    values: order_key_column(batch.column(i))?,
                    options: Some(o),
                })
            })
            .collect::<Result<Vec<_>>>()?;
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
/// ints) as i64, if it has that type and no nulls. 8-byte types share the
/// column's buffer (no copy); smaller ones are widened.
pub(crate) fn int_key(a: &arrow_array::ArrayRef) -> Option<ScalarBuffer<i64>> {
    use arrow_schema::DataType::*;
    if a.null_count() > 0 {
        return None;
    }
    match a.data_type() {
        Int64 | Timestamp(..) | Date64 | Time64(_) | Duration(_) => {
            let d = a.to_data();
            let [b] = d.buffers() else {
                return None;
            };
            // `ScalarBuffer::new` asserts alignment and length: a buffer
            // that would fail them takes the caller's general path.
            let fits = (b.as_ptr() as usize) % std::mem::align_of::<i64>() == 0
                && b.len() >= (d.offset() + d.len()) * 8;
            fits.then(|| ScalarBuffer::new(b.clone(), d.offset(), d.len()))
        }
        Int8 | Int16 | Int32 | UInt8 | UInt16 | UInt32 | Date32 => {
            let c = arrow_cast::cast(a, &Int64).ok()?;
            let v = c.as_any().downcast_ref::<arrow_array::Int64Array>()?;
            Some(v.values().clone())
        }
        _ => None,
    }
}

/// Sorts the rows of several batches into one batch without first
/// concatenating them. Fast path, for one or two ascending integer-like keys
/// without nulls: a stable radix sort of the keys with each row's (batch,
/// row) as payload (equal keys keep their input order), then one gather
/// per column ([`gather_rows`]). Otherwise: concatenate, then
/// [`local_sort`].
pub fn sort_parts(
    schema: &SchemaRef,
    parts: Vec<RecordBatch>,
    keys: &[SortKey],
) -> Result<RecordBatch> {
    if parts.is_empty() {
        return Ok(RecordBatch::new_empty(schema.clone()));
    }
    for p in &parts {
        check_columns("sort", schema, p)?;
    }
    if let Some(rows) = radix_order(schema, &parts, keys)? {
        return gather_rows(schema, &parts, &rows);
    }
    let all = concat_batches(schema, &parts)?;
    drop(parts);
    local_sort(&all, keys)
}

/// The rows of `parts` in the order of one or two ascending integer-like
/// keys without nulls (ties in input order), each as `batch << 32 | row`;
/// `None` when the keys are not of that kind.
fn radix_order(
    schema: &SchemaRef,
    parts: &[RecordBatch],
    keys: &[SortKey],
) -> Result<Option<Vec<u64>>> {
    if !(1..=2).contains(&keys.len()) || keys.iter().any(|k| k.descending) {
        return Ok(None);
    }
    if parts.len() > u32::MAX as usize || parts.iter().any(|p| p.num_rows() > u32::MAX as usize) {
        return Ok(None);
    }
    let cols: Vec<usize> = keys
        .iter()
        .map(|k| column_index(schema, &k.column))
        .collect::<Result<_>>()?;
    // The key columns per batch, as i64 (None: not integer-like, or nulls).
    let mut key_parts: Vec<Vec<ScalarBuffer<i64>>> = Vec::with_capacity(cols.len());
    for c in &cols {
        let mut v = Vec::with_capacity(parts.len());
        for p in parts {
            match int_key(p.column(*c)) {
                Some(k) => v.push(k),
                None => return Ok(None),
            }
        }
        key_parts.push(v);
    }
    let total: usize = parts.iter().map(|p| p.num_rows()).sum();
    let threads = rank_threads();
    let flat = |kp: &[ScalarBuffer<i64>]| -> Vec<u64> {
        let mut out = braid_core::memory::large_vec(total);
        for k in kp {
            out.extend(k.iter().map(|x| order_key(*x)));
        }
        out
    };
    let mut rows: Vec<u64> = braid_core::memory::large_vec(total);
    for (b, p) in parts.iter().enumerate() {
        rows.extend((0..p.num_rows() as u64).map(|r| (b as u64) << 32 | r));
    }
    // Two keys whose value ranges fit in 64 bits together sort as one
    // packed key (one sort; a group id and a time stamp usually do).
    if let [k0, k1] = key_parts.as_slice() {
        if let (Some((lo0, w0)), Some((lo1, w1))) = (range_bits(k0), range_bits(k1)) {
            if w0 + w1 <= 64 {
                let mut packed: Vec<u64> = braid_core::memory::large_vec(total);
                for (a, b) in k0.iter().zip(k1) {
                    packed.extend(a.iter().zip(b.iter()).map(|(x, y)| {
                        let hi = x.wrapping_sub(lo0) as u64;
                        let lo = y.wrapping_sub(lo1) as u64;
                        // w1 < 64 here unless w0 == 0 (then hi == 0).
                        hi.checked_shl(w1).unwrap_or(0) | lo
                    }));
                }
                return Ok(Some(radix_sort_pairs_on(packed, rows, threads).1));
            }
        }
    }
    // Least significant key first: each pass is stable.
    let last = key_parts.len() - 1;
    let (_, mut rows) = radix_sort_pairs_on(flat(&key_parts[last]), rows, threads);
    if last == 1 {
        let first = &key_parts[0];
        let k0: Vec<u64> = rows
            .iter()
            .map(|r| {
                let (b, i) = unpack_row(*r);
                order_key(first[b][i])
            })
            .collect();
        rows = radix_sort_pairs_on(k0, rows, threads).1;
    }
    Ok(Some(rows))
}

/// The smallest value of a key over the parts and the bits its range
/// needs (`max - min` as an unsigned number); `None` for no values.
fn range_bits(parts: &[ScalarBuffer<i64>]) -> Option<(i64, u32)> {
    let mut it = parts.iter().flat_map(|p| p.iter().copied());
    let first = it.next()?;
    let (lo, hi) = it.fold((first, first), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let span = hi.wrapping_sub(lo) as u64;
    Some((lo, 64 - span.leading_zeros()))
}

/// One batch of the rows of `parts` named by `rows` (`batch << 32 | row`,
/// in output order). Fixed-width columns (integers, floats, time types,
/// decimals) are gathered straight from the parts' value buffers, with
/// their validity; other columns go through Arrow's `interleave`.
pub fn gather_rows(schema: &SchemaRef, parts: &[RecordBatch], rows: &[u64]) -> Result<RecordBatch> {
    for p in parts {
        check_columns("gather", schema, p)?;
    }
    if let Some(r) = rows.iter().find(|r| {
        let (b, i) = unpack_row(**r);
        parts.get(b).is_none_or(|p| i >= p.num_rows())
    }) {
        let (b, i) = unpack_row(*r);
        return Err(DataError::Invalid(format!(
            "gather: row {i} of part {b} is not among the {} parts' rows",
            parts.len()
        )));
    }
    // (batch, row) pairs for the columns that go through `interleave`,
    // made once by the first such column.
    let pairs: OnceLock<Vec<(usize, usize)>> = OnceLock::new();
    // Columns are gathered on the rank's threads (each column is one
    // pass over `rows`, independent of the others).
    let cols = map_scoped(
        (0..schema.fields().len()).collect(),
        rank_threads(),
        |c| -> Result<ArrayRef> {
            let arrays: Vec<&ArrayRef> = parts.iter().map(|p| p.column(c)).collect();
            let datas: Vec<ArrayData> = arrays.iter().map(|a| a.to_data()).collect();
            let dtype = schema.field(c).data_type();
            let gathered = match dtype.primitive_width() {
                Some(1) => gather_fixed::<u8>(dtype, &datas, rows),
                Some(2) => gather_fixed::<u16>(dtype, &datas, rows),
                Some(4) => gather_fixed::<u32>(dtype, &datas, rows),
                Some(8) => gather_fixed::<u64>(dtype, &datas, rows),
                Some(16) => gather_fixed::<i128>(dtype, &datas, rows),
                _ => None,
            };
            Ok(match gathered {
                Some(d) => make_array(d?),
                None => {
                    let idx = pairs.get_or_init(|| rows.iter().map(|r| unpack_row(*r)).collect());
                    let dyns: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
                    arrow_select::interleave::interleave(&dyns, idx)?
                }
            })
        },
    )
    .into_iter()
    .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}

/// Gathers one fixed-width column (`T`: its values' width); `None` when a
/// part's layout is not one plain value buffer of `T`.
fn gather_fixed<T: ArrowNativeType>(
    dtype: &arrow_schema::DataType,
    datas: &[ArrayData],
    rows: &[u64],
) -> Option<Result<ArrayData>> {
    let mut values: Vec<&[T]> = Vec::with_capacity(datas.len());
    for d in datas {
        let [buf] = d.buffers() else {
            return None;
        };
        // `typed_data` asserts alignment: a misaligned buffer (from an
        // unusual producer) takes the general path instead.
        let aligned = (buf.as_ptr() as usize) % std::mem::align_of::<T>() == 0
            && buf.len() % std::mem::size_of::<T>() == 0;
        if d.data_type() != dtype || !aligned {
            return None;
        }
        let all: &[T] = buf.typed_data();
        values.push(all.get(d.offset()..d.offset() + d.len())?);
    }
    let mut out: Vec<T> = braid_core::memory::large_vec(rows.len());
    if !gather_packed(&values, rows, &mut out) {
        return None;
    }
    let nulls = if datas.iter().any(|d| d.nulls().is_some()) {
        let mut bits = BooleanBufferBuilder::new(rows.len());
        for r in rows {
            let (b, i) = unpack_row(*r);
            bits.append(datas[b].nulls().is_none_or(|n| n.is_valid(i)));
        }
        Some(NullBuffer::new(bits.finish()))
    } else {
        None
    };
    let data = ArrayData::builder(dtype.clone())
        .len(rows.len())
        .add_buffer(ScalarBuffer::from(out).into_inner())
        .nulls(nulls)
        .build();
    Some(data.map_err(Into::into))
}

/// The part of `b` after its 4-byte length, and what follows it (`None`
/// where `b` is shorter than it says).
fn length_prefixed(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = b.split_first_chunk::<4>()?;
    rest.split_at_checked(u32::from_le_bytes(*len) as usize)
}

/// A rank's samples as it sent them: its signature, its samples' lengths
/// and the samples, each part after its length (`None`: malformed).
fn sample_parts(body: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let (sig, rest) = length_prefixed(body)?;
    let (lens, samples) = length_prefixed(rest)?;
    Some((sig, lens, samples))
}

/// How the sort's errors name it ([`DataError::at`]).
const SORT_STEP: &str = "distributed sort";

/// A distributed sort by `keys`.
#[derive(Debug, Clone)]
pub struct DistributedSort {
    /// The sort keys, most significant first.
    pub keys: Vec<SortKey>,
    /// Samples per rank (more: better balance, bigger AllGather).
    pub samples_per_rank: usize,
}

/// The `n - 1` splitters that cut the samples into `n` ranges of equal
/// weight (rows): a rank's samples each stand for its rows over its sample
/// count, so a rank with few rows does not get as many splitters as one
/// with many (with equal weights a rank of 1,000 rows beside one of 10^7
/// over a key range of its own took half the key space: one range of
/// 10^7 rows, one of 1,000). Deterministic: every rank sorts the same
/// samples the same way (weights break key ties) and sums in that order.
/// No samples (no rows anywhere): no splitters. The GPU job's sort picks
/// its splitters here too (keys as i64).
pub(crate) fn weighted_splitters<K: Ord + Clone>(mut samples: Vec<(K, f64)>, n: usize) -> Vec<K> {
    if samples.is_empty() {
        return Vec::new();
    }
    samples.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let total: f64 = samples.iter().map(|s| s.1).sum();
    let mut out = Vec::with_capacity(n.saturating_sub(1));
    let mut acc = 0.0f64;
    let mut i = 0usize;
    for k in 1..n {
        let target = total * k as f64 / n as f64;
        while i + 1 < samples.len() && acc + samples[i].1 <= target {
            acc += samples[i].1;
            i += 1;
        }
        out.push(samples[i].0.clone());
    }
    out
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
    /// sorted partition. Every rank must sort by the same keys with the
    /// same columns: ranks that differ all fail with
    /// [`DataError::Mismatch`] (checked with the samples, before any row
    /// moves). Errors name this rank ([`DataError::at`]).
    pub async fn sort(
        &self,
        ctx: &Context,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Result<RecordBatch> {
        self.sort_here(ctx, schema, batches)
            .await
            .map_err(|e| e.at(ctx.rank(), SORT_STEP))
    }

    /// What every rank's call must agree on: the keys and the columns.
    fn signature(&self, schema: &arrow_schema::Schema) -> (String, String) {
        let keys = self
            .keys
            .iter()
            .map(|k| {
                format!(
                    "{:?} {} nulls {}",
                    k.column,
                    if k.descending {
                        "descending"
                    } else {
                        "ascending"
                    },
                    if k.nulls_first { "first" } else { "last" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let columns = schema
            .fields()
            .iter()
            .map(|f| format!("{:?}: {}", f.name(), f.data_type()))
            .collect::<Vec<_>>()
            .join(", ");
        (keys, columns)
    }

    async fn sort_here(
        &self,
        ctx: &Context,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Result<RecordBatch> {
        let n = ctx.nranks() as usize;
        let keys = resolve(&schema, &self.keys)?;
        for b in &batches {
            check_columns("distributed sort", &schema, b)?;
        }
        if n == 1 {
            let (schema, sk) = (schema.clone(), self.keys.clone());
            return tokio::task::spawn_blocking(move || sort_parts(&schema, batches, &sk))
                .await
                .map_err(|e| DataError::Invalid(e.to_string()))?;
        }
        // 1. Sample.
        let conv = Arc::new(converter(&schema, &keys)?);
        let total: usize = batches.iter().map(|b| b.num_rows()).sum();
        // At least one sample from a rank with rows: with none, ranks that
        // hold rows would make no splitters (one range, not one a rank).
        let want = self.samples_per_rank.max(1).min(total);
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
        // 2. Gather samples with each rank's row count and its call's
        // signature (checked against this rank's); pick splitters (the
        // same on every rank).
        let (my_keys, my_columns) = self.signature(&schema);
        let sig = format!("{my_keys}\0{my_columns}");
        // The data (sent in pieces under a small message limit, where the
        // frame's metadata is not): the signature, the samples' lengths,
        // then the samples, each part after its length.
        let mut body = Vec::with_capacity(8 + sig.len() + lens.len() + bytes.len());
        for part in [sig.as_bytes(), &lens] {
            body.extend_from_slice(&(part.len() as u32).to_le_bytes());
            body.extend_from_slice(part);
        }
        body.extend_from_slice(&bytes);
        let ag = AllGather::new(ctx, None);
        ag.insert(
            0,
            PackedData {
                metadata: bytes::Bytes::copy_from_slice(&(total as u64).to_le_bytes()),
                data: Buffer::from_vec(body),
            },
        )?;
        ag.insert_finished()?;
        // (sample, rows it stands for): a rank's samples share its rows.
        let mut samples: Vec<(Vec<u8>, f64)> = Vec::new();
        let gathered = ag.extract(ExtractOrder::RankSeq).await?;
        let malformed =
            |peer: Rank| DataError::Invalid(format!("malformed samples from rank {peer}"));
        // Every rank's call first: a rank that differs fails every rank
        // here, before any row moves.
        for g in &gathered {
            let peer = g.rank;
            let (their_sig, _, _) =
                sample_parts(g.data.data.as_slice()).ok_or_else(|| malformed(peer))?;
            if their_sig != sig.as_bytes() {
                let their = String::from_utf8_lossy(their_sig);
                let (their_keys, their_columns) = their.split_once('\0').unwrap_or((&their, ""));
                let detail = if their_keys != my_keys {
                    format!("rank {peer} sorts by [{their_keys}], this rank by [{my_keys}]")
                } else {
                    format!(
                        "rank {peer}'s rows have columns [{their_columns}], this rank's [{my_columns}]"
                    )
                };
                return Err(DataError::Mismatch {
                    rank: ctx.rank(),
                    step: SORT_STEP,
                    peer,
                    detail,
                });
            }
        }
        for g in &gathered {
            let peer = g.rank;
            let malformed = || malformed(peer);
            let rows = g
                .data
                .metadata
                .first_chunk::<8>()
                .map(|r| u64::from_le_bytes(*r))
                .ok_or_else(malformed)?;
            let (_, lens, data) = sample_parts(g.data.data.as_slice()).ok_or_else(malformed)?;
            let weight = rows as f64 / (lens.len() / 4).max(1) as f64;
            let mut off = 0usize;
            for l in lens.chunks_exact(4) {
                let l = u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize;
                let s = off
                    .checked_add(l)
                    .and_then(|end| data.get(off..end))
                    .ok_or_else(malformed)?;
                samples.push((s.to_vec(), weight));
                off += l;
            }
        }
        let splitters = weighted_splitters(samples, n);
        // 3 + 4. Partition, shuffle, sort locally. This rank's own range
        // stays as batches (no packing, no copy).
        let splitters = Arc::new(Splitters::new(&schema, &conv, &keys, splitters));
        let mut shuffle = TableShuffle::new(ctx, schema.clone());
        // Empty batches carry nothing, and with no rows anywhere there are
        // no splitters to cut them into one part a rank.
        for b in batches.into_iter().filter(|b| b.num_rows() > 0) {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use arrow_array::{
        BooleanArray, Decimal128Array, Float64Array, Int32Array, Int64Array, StringArray,
        TimestampMicrosecondArray,
    };
    use arrow_schema::{DataType, Field, Schema, TimeUnit};

    fn next(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("t", DataType::Timestamp(TimeUnit::Microsecond, None), false),
            Field::new("small", DataType::Int32, true),
            Field::new("v", DataType::Float64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("d", DataType::Decimal128(20, 2), true),
            Field::new("b", DataType::Boolean, true),
        ]))
    }

    /// A batch of `n` rows with few distinct keys (many ties), negative
    /// values, and nulls in every nullable column.
    fn batch(s: &mut u64, n: usize) -> RecordBatch {
        let mut col = |f: &mut dyn FnMut(u64) -> Option<u64>| -> Vec<Option<u64>> {
            (0..n).map(|_| f(next(s))).collect()
        };
        let k = col(&mut |x| Some(x % 7));
        let t = col(&mut |x| Some(x % 50));
        let small = col(&mut |x| (x % 5 != 0).then_some(x % 1000));
        let v = col(&mut |x| (x % 4 != 0).then_some(x));
        let st = col(&mut |x| (x % 6 != 0).then_some(x % 100));
        let d = col(&mut |x| (x % 3 != 0).then_some(x));
        let b = col(&mut |x| (x % 5 != 1).then_some(x % 2));
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(
                    k.iter().map(|x| x.unwrap() as i64 - 3),
                )),
                Arc::new(TimestampMicrosecondArray::from_iter_values(
                    t.iter().map(|x| x.unwrap() as i64 - 25),
                )),
                Arc::new(Int32Array::from_iter(
                    small.iter().map(|x| x.map(|y| y as i32 - 500)),
                )),
                Arc::new(Float64Array::from_iter(
                    v.iter()
                        .map(|x| x.map(|y| (y % 10_000) as f64 / 7.0 - 700.0)),
                )),
                Arc::new(StringArray::from_iter(
                    st.iter().map(|x| x.map(|y| format!("s{y}"))),
                )),
                Arc::new(
                    Decimal128Array::from_iter(
                        d.iter()
                            .map(|x| x.map(|y| (y as i128) << 40 | (y % 97) as i128)),
                    )
                    .with_precision_and_scale(20, 2)
                    .unwrap(),
                ),
                Arc::new(BooleanArray::from_iter(b.iter().map(|x| x.map(|y| y == 1)))),
            ],
        )
        .unwrap()
    }

    /// The reference: concatenate, then a stable sort of row numbers by
    /// the keys (ties keep input order), then `take`.
    fn reference(parts: &[RecordBatch], keys: &[&str]) -> RecordBatch {
        let all = concat_batches(&schema(), parts).unwrap();
        let cols: Vec<Vec<i64>> = keys
            .iter()
            .map(|k| {
                let c = all.column(all.schema().index_of(k).unwrap());
                int_key(c).unwrap().to_vec()
            })
            .collect();
        let mut ix: Vec<u32> = (0..all.num_rows() as u32).collect();
        ix.sort_by_key(|i| cols.iter().map(|c| c[*i as usize]).collect::<Vec<_>>());
        take_record_batch(&all, &arrow_array::UInt32Array::from(ix)).unwrap()
    }

    /// The radix path against the reference, column by column, for one and
    /// two keys, over batches of odd sizes, one of them a slice (offset).
    #[test]
    fn sort_parts_matches_a_stable_reference() {
        let mut s = 0x5EED_1234_ABCD_0001u64;
        for sizes in [
            vec![0usize],
            vec![1],
            vec![3, 0, 700],
            vec![1000, 1, 333, 64],
        ] {
            let mut parts: Vec<RecordBatch> = sizes.iter().map(|n| batch(&mut s, *n)).collect();
            if let Some(p) = parts.iter_mut().find(|p| p.num_rows() > 10) {
                *p = p.slice(3, p.num_rows() - 7);
            }
            // "wide": k spread over 2^63, so (k, t) no longer packs into
            // one 64-bit key and the two keys sort in two passes.
            let wide: Vec<RecordBatch> = parts
                .iter()
                .map(|p| {
                    let k = p.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                    let spread = Int64Array::from_iter_values(k.values().iter().map(|x| x << 60));
                    let mut cols = p.columns().to_vec();
                    cols[0] = Arc::new(spread);
                    RecordBatch::try_new(schema(), cols).unwrap()
                })
                .collect();
            for (parts, keys) in [
                (&parts, vec!["t"]),
                (&parts, vec!["k", "t"]),
                (&wide, vec!["k", "t"]),
                (&parts, vec!["small"]),
            ] {
                let sk: Vec<SortKey> = keys.iter().map(|k| SortKey::asc(*k)).collect();
                let got = sort_parts(&schema(), parts.clone(), &sk).unwrap();
                let parts = parts.as_slice();
                // The nullable Int32 key takes the general path; the
                // others the radix path.
                let want = if keys == ["small"] {
                    let all = concat_batches(&schema(), parts).unwrap();
                    local_sort(&all, &sk).unwrap()
                } else {
                    reference(parts, &keys)
                };
                assert_eq!(got.num_rows(), want.num_rows(), "{sizes:?} by {keys:?}");
                for c in 0..want.num_columns() {
                    assert_eq!(
                        got.column(c).to_data(),
                        want.column(c).to_data(),
                        "{sizes:?} by {keys:?}: column {}",
                        want.schema().field(c).name()
                    );
                }
            }
        }
    }
}
