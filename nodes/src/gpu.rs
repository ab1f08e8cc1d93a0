//! The rolling job on GPUs (feature `cuda`): one rank per GPU, chunks as
//! [`DeviceTable`]s, the device collectives for every byte that moves.
//!
//! ```text
//!   source ─host─> to_device ─device─> gpu_rolling ─device─> to_host ─host─> sink
//!
//!   gpu_rolling, ungrouped:
//!     1. radix sort by ts; sample splitters (AllGather of 64 ts per rank
//!        over the host, weighed by the rank's rows); AllToAllv of every
//!        column; radix sort again (equal ts share a splitter side, so
//!        they stay on one rank)
//!     2. AllGather of (rows, min ts, max ts); HaloExchange rounds of packed
//!        (ts, values, validity) suffixes, as on the CPU path
//!     3. the rolling kernel over ghost rows ++ own rows
//!   gpu_rolling, grouped (as on the CPU path: a group may span ranks):
//!     1. radix sort by (key, ts) (two stable passes: ts, then key);
//!        splitters from (key, ts) samples; AllToAllv of every column;
//!        radix sort again (equal pairs stay on one rank)
//!     2. AllGather of (rows, first and last ts and key); HaloExchange
//!        rounds of the rows of the group that starts the next rank
//!     3. the rolling kernel with the key column (windows stop at a key)
//!        over ghost rows ++ own rows
//! ```
//!
//! The output has the CPU job's rows and columns (the row order within a
//! rank may differ). Variable-width columns (strings) have no device form:
//! the job says which column before any work. Memory: the rank's rows, a
//! sorted copy and the kernel's outputs on the device at once.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{DataType, Field, FieldRef, Schema, SchemaRef};
use braid_coll::allgather;
use braid_coll::device::{DeviceAllToAllv, DeviceComm, DeviceHaloExchange, alltoallv};
use braid_core::cuda::{DeviceBuffer, DeviceColumn, DeviceTable, Gpu};
use braid_core::{Message, NodeError, Payload, Receiver, Sender};
use braid_kernels::gpu::{
    NumType, RollingInput, cast_to_f64, cast_to_i64, gather, iota, iota_i64, lower_bound,
    order_key_i64, radix_sort, rolling,
};

use crate::error::DataError;
use crate::partition::{canonical_group_key, column_index, group_key_type};
use crate::rolling::{RollingSpec, order_as_i64};

/// Any failure of the GPU path, as a node error.
fn fail(e: impl std::fmt::Display) -> NodeError {
    NodeError::other(e.to_string())
}

/// The kernels' name for an Arrow numeric type.
fn num_type(t: &DataType) -> Option<NumType> {
    Some(match t {
        DataType::Int8 => NumType::I8,
        DataType::Int16 => NumType::I16,
        DataType::Int32 | DataType::Date32 | DataType::Time32(_) => NumType::I32,
        DataType::Int64
        | DataType::Timestamp(..)
        | DataType::Date64
        | DataType::Time64(_)
        | DataType::Duration(_) => NumType::I64,
        DataType::UInt8 => NumType::U8,
        DataType::UInt16 => NumType::U16,
        DataType::UInt32 => NumType::U32,
        DataType::UInt64 => NumType::U64,
        DataType::Float32 => NumType::F32,
        DataType::Float64 => NumType::F64,
        _ => return None,
    })
}

/// Which columns of a GPU rolling run live on the device, and so which
/// input types it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Columns {
    /// Every column travels on the device ([`gpu_rolling_node`]: device
    /// chunks in and out): fixed-width columns only, and an integer group
    /// column without nulls.
    AllOnDevice,
    /// Only the order, group and value columns go to the device; every
    /// other column stays on the host at the rank that read it
    /// ([`gpu_rolling_job_node`]): any column types, any group column.
    Needed,
}

/// Checks that a GPU rolling run can take `spec` on `schema` (before any
/// work).
pub fn check_gpu_spec(
    spec: &RollingSpec,
    schema: &Schema,
    columns: Columns,
) -> Result<(), DataError> {
    braid_kernels::gpu::check_window(spec.window).map_err(DataError::Invalid)?;
    if columns == Columns::AllOnDevice {
        for f in schema.fields() {
            if braid_core::cuda::device_width(f.data_type()).is_none() {
                return Err(DataError::Invalid(format!(
                    "gpu rolling node: column {:?} of type {} has no device form (fixed-width types only)",
                    f.name(),
                    f.data_type()
                )));
            }
        }
    }
    if columns == Columns::AllOnDevice {
        // The node reads the order column on the device as i64.
        let t = schema.field(column_index(schema, &spec.order)?).data_type();
        if num_type(t) != Some(NumType::I64) {
            return Err(DataError::WrongType {
                name: spec.order.clone(),
                found: t.to_string(),
                expected: "Int64, Date64 or Timestamp (in the gpu rolling node)".into(),
            });
        }
    }
    for v in &spec.values {
        let t = schema.field(column_index(schema, v)?).data_type();
        // The job casts other numeric types (decimals, f16) to f64 on the
        // host; the node takes device columns as they are.
        let takes = match columns {
            Columns::AllOnDevice => num_type(t).is_some(),
            Columns::Needed => crate::rolling::numbers(t),
        };
        if !takes {
            return Err(DataError::WrongType {
                name: v.clone(),
                found: t.to_string(),
                expected: match columns {
                    Columns::AllOnDevice => {
                        "a numeric type of 8 to 64 bits (in the gpu rolling node)"
                    }
                    Columns::Needed => "a numeric type",
                }
                .into(),
            });
        }
    }
    if columns == Columns::AllOnDevice && spec.by.len() > 1 {
        // Only the job's node codes several group columns as one.
        return Err(DataError::Invalid(format!(
            "the gpu rolling node groups by one column, not {:?} (the GPU job codes several as one)",
            spec.by
        )));
    }
    for by in &spec.by {
        let t = schema.field(column_index(schema, by)?).data_type();
        if columns == Columns::AllOnDevice && !num_type(t).is_some_and(NumType::is_integer) {
            return Err(DataError::WrongType {
                name: by.clone(),
                found: t.to_string(),
                expected: "an integer type (in the gpu rolling node)".into(),
            });
        }
    }
    Ok(())
}

/// Copies host chunks to the device (device chunks pass through).
pub async fn to_device(
    gpu: Arc<Gpu>,
    mut input: Receiver,
    mut output: Sender,
) -> Result<(), NodeError> {
    while let Some(m) = input.recv().await {
        let payload = match m.payload {
            Payload::Table(t) => {
                Payload::Device(DeviceTable::from_batch(&gpu, t.batch()).map_err(fail)?)
            }
            p => p,
        };
        output.send(Message::new(m.seq, payload)).await?;
    }
    Ok(())
}

/// Copies device chunks to the host (host chunks pass through).
pub async fn to_host(mut input: Receiver, mut output: Sender) -> Result<(), NodeError> {
    while let Some(m) = input.recv().await {
        let payload = match m.payload {
            Payload::Device(t) => Payload::from(t.to_batch().map_err(fail)?),
            p => p,
        };
        output.send(Message::new(m.seq, payload)).await?;
    }
    Ok(())
}

/// Every column of `t` reordered by `perm` (u32 row indices).
fn gather_table(
    gpu: &Arc<Gpu>,
    t: &DeviceTable,
    perm: &DeviceBuffer,
) -> Result<DeviceTable, NodeError> {
    let rows = perm.len() / 4;
    let mut cols = Vec::with_capacity(t.columns().len());
    for (f, c) in t.schema().fields().iter().zip(t.columns()) {
        let w = braid_core::cuda::device_width(f.data_type()).unwrap_or(0);
        let data = gather(gpu, &c.data, w, perm).map_err(fail)?;
        let valid = match &c.valid {
            Some(v) => Some(gather(gpu, v, 1, perm).map_err(fail)?),
            None => None,
        };
        cols.push(DeviceColumn { data, valid });
    }
    DeviceTable::new(gpu, t.schema().clone(), cols, rows).map_err(fail)
}

/// The sorting permutation of i64 values (stable), continuing from `perm`
/// (the rows' current order) when given.
fn sort_perm_i64(
    gpu: &Arc<Gpu>,
    values: &DeviceBuffer,
    perm: Option<DeviceBuffer>,
) -> Result<(DeviceBuffer, DeviceBuffer), NodeError> {
    let n = values.len() / 8;
    let (keys, perm) = match perm {
        None => (
            order_key_i64(gpu, values).map_err(fail)?,
            iota(gpu, n).map_err(fail)?,
        ),
        Some(p) => {
            let v = gather(gpu, values, 8, &p).map_err(fail)?;
            (order_key_i64(gpu, &v).map_err(fail)?, p)
        }
    };
    radix_sort(gpu, keys, perm).map_err(fail)
}

/// Reads one i64 at row `i` of an i64 column.
fn read_i64(buf: &DeviceBuffer, i: usize) -> Result<i64, NodeError> {
    let mut b = [0u8; 8];
    buf.read_at(i * 8, &mut b).map_err(fail)?;
    Ok(i64::from_le_bytes(b))
}

/// Sends rows `[bounds[p], bounds[p + 1])` of `t` to rank p (every column
/// through one device AllToAllv) and returns what every rank sent here, in
/// rank order.
async fn exchange_rows(
    dc: &DeviceComm,
    t: &DeviceTable,
    bounds: &[usize],
) -> Result<DeviceTable, NodeError> {
    let gpu = dc.gpu().clone();
    let ctx = dc.ctx();
    let n = dc.nranks() as usize;
    let me = dc.rank() as usize;
    // Row counts to every rank and which columns have nulls, from everyone.
    let ncols = t.columns().len();
    let mut mine: Vec<i64> = (0..n).map(|p| (bounds[p + 1] - bounds[p]) as i64).collect();
    mine.extend(t.columns().iter().map(|c| i64::from(c.valid.is_some())));
    let all = allgather(ctx, mine).await.map_err(fail)?;
    let row = n + ncols;
    // Every rank sends as many values (its table has as many columns);
    // a peer that sent another count would misplace every index below.
    if all.len() != n * row {
        return Err(fail(format!(
            "rank {me}: the ranks announced {} row counts and null flags in all, not {} ({n} ranks of {ncols} columns each): their tables differ",
            all.len(),
            n * row
        )));
    }
    // Counts come from peers: checked, so a bad one is an error naming
    // the peer, not a wrapped size.
    let recv_rows: Vec<usize> = (0..n)
        .map(|q| {
            usize::try_from(all[q * row + me]).map_err(|_| {
                fail(format!(
                    "rank {me}: rank {q} announced {} rows",
                    all[q * row + me]
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    let total = recv_rows
        .iter()
        .try_fold(0usize, |a, r| a.checked_add(*r))
        .ok_or_else(|| fail(format!("rank {me}: received row counts overflow")))?;
    let mut cols = Vec::with_capacity(ncols);
    for (ci, (f, c)) in t.schema().fields().iter().zip(t.columns()).enumerate() {
        let w = braid_core::cuda::device_width(f.data_type()).unwrap_or(0);
        let spec = DeviceAllToAllv::packed(
            (0..n).map(|p| (bounds[p + 1] - bounds[p]) * w).collect(),
            recv_rows.iter().map(|r| r * w).collect(),
        );
        let out = DeviceBuffer::alloc(&gpu, total * w).map_err(fail)?;
        let data = alltoallv(dc, &c.data, out, spec).await.map_err(fail)?;
        let any_nulls = (0..n).any(|q| all[q * row + n + ci] != 0);
        let valid = if any_nulls {
            let ones;
            let src = match &c.valid {
                Some(v) => v,
                None => {
                    let mut b = DeviceBuffer::alloc(&gpu, t.num_rows()).map_err(fail)?;
                    b.fill(1).map_err(fail)?;
                    ones = b;
                    &ones
                }
            };
            let spec = DeviceAllToAllv::packed(
                (0..n).map(|p| bounds[p + 1] - bounds[p]).collect(),
                recv_rows.clone(),
            );
            let out = DeviceBuffer::alloc(&gpu, total).map_err(fail)?;
            Some(alltoallv(dc, src, out, spec).await.map_err(fail)?)
        } else {
            None
        };
        cols.push(DeviceColumn { data, valid });
    }
    DeviceTable::new(&gpu, t.schema().clone(), cols, total).map_err(fail)
}

/// Where `rows` rows sorted by their order keys `keys` (u64, as
/// `order_key_i64` makes them) split among ranks: rank p takes rows
/// `[bounds[p], bounds[p + 1])`, cut at the first key >= each of the
/// ascending `splitters` (one per rank after the first).
fn split_bounds(
    gpu: &Arc<Gpu>,
    keys: &DeviceBuffer,
    splitters: &[u64],
    rows: usize,
) -> Result<Vec<usize>, NodeError> {
    let q = DeviceBuffer::from_slice(gpu, splitters).map_err(fail)?;
    let cut: Vec<u64> = lower_bound(gpu, keys, &q)
        .map_err(fail)?
        .to_vec()
        .map_err(fail)?;
    let mut bounds = vec![0usize];
    bounds.extend(cut.iter().map(|c| *c as usize));
    bounds.push(rows);
    Ok(bounds)
}

/// Samples per rank for the splitters of the distributed sort.
const SAMPLES: usize = 64;

/// The `n - 1` splitters of a distributed sort from this rank's samples:
/// `samples` holds `width` i64s per sample (a sort key: ts, or (key, ts)),
/// drawn evenly from its `rows` sorted rows. Each rank's samples stand for
/// its rows over its sample count (see `weighted_splitters`), so a rank
/// with few rows over a key range of its own does not take a range as
/// large as a rank with many. No rows anywhere: no splitters.
async fn sample_splitters(
    dc: &DeviceComm,
    samples: Vec<i64>,
    width: usize,
    rows: usize,
) -> Result<Vec<Vec<i64>>, NodeError> {
    let n = dc.nranks() as usize;
    let count = samples.len() / width;
    let all = allgather(dc.ctx(), vec![count as i64, rows as i64])
        .await
        .map_err(fail)?;
    let (counts, weights): (Vec<usize>, Vec<f64>) = all
        .chunks_exact(2)
        .map(|c| {
            let count = usize::try_from(c[0]).unwrap_or(0).min(SAMPLES);
            (count, c[1].max(0) as f64 / count.max(1) as f64)
        })
        .unzip();
    if counts.len() != n {
        return Err(fail(format!(
            "sample counts of {} ranks, not {n}",
            counts.len()
        )));
    }
    // Pad to the largest sample count so the gather is regular.
    let most = counts.iter().copied().max().unwrap_or(0) * width;
    let mut padded = samples;
    padded.resize(most, 0);
    let gathered = allgather(dc.ctx(), padded).await.map_err(fail)?;
    let mut pool: Vec<(Vec<i64>, f64)> = Vec::new();
    for (r, c) in counts.iter().enumerate() {
        let part = gathered
            .get(r * most..r * most + c * width)
            .ok_or_else(|| fail(format!("rank {r}'s order samples came short")))?;
        pool.extend(part.chunks_exact(width).map(|x| (x.to_vec(), weights[r])));
    }
    Ok(crate::sort::weighted_splitters(pool, n))
}

/// Ungrouped step 1: this rank's run of the table globally sorted by the
/// order column, with its sorted order keys (u64).
async fn global_sort(
    dc: &DeviceComm,
    t: DeviceTable,
    oi: usize,
) -> Result<(DeviceTable, DeviceBuffer), NodeError> {
    let gpu = dc.gpu().clone();
    let (keys, perm) = sort_perm_i64(&gpu, &t.columns()[oi].data, None)?;
    let sorted = gather_table(&gpu, &t, &perm)?;
    drop(t);
    let n = dc.nranks() as usize;
    if n == 1 {
        return Ok((sorted, keys));
    }
    let rows = sorted.num_rows();
    let ts = &sorted.columns()[oi].data;
    let m = SAMPLES.min(rows);
    let samples = (0..m)
        .map(|j| read_i64(ts, j * rows / m))
        .collect::<Result<Vec<i64>, _>>()?;
    let mut splitters: Vec<u64> = sample_splitters(dc, samples, 1, rows)
        .await?
        .into_iter()
        .map(|x| (x.first().copied().unwrap_or(i64::MAX) as u64) ^ (1 << 63))
        .collect();
    splitters.resize(n - 1, u64::MAX);
    let bounds = split_bounds(&gpu, &keys, &splitters, rows)?;
    let got = exchange_rows(dc, &sorted, &bounds).await?;
    drop(sorted);
    let (keys, perm) = sort_perm_i64(&gpu, &got.columns()[oi].data, None)?;
    Ok((gather_table(&gpu, &got, &perm)?, keys))
}

/// `t` sorted by (group key, ts) (two stable radix passes: ts, then key),
/// and its group key (column `ki` of type `kty`) as i64 in that order.
fn sort_by_key_ts(
    gpu: &Arc<Gpu>,
    t: &DeviceTable,
    oi: usize,
    ki: usize,
    kty: NumType,
) -> Result<(DeviceTable, DeviceBuffer), NodeError> {
    let key = cast_to_i64(gpu, &t.columns()[ki].data, kty).map_err(fail)?;
    let (_, p1) = sort_perm_i64(gpu, &t.columns()[oi].data, None)?;
    let (_, p2) = sort_perm_i64(gpu, &key, Some(p1))?;
    let sorted = gather_table(gpu, t, &p2)?;
    let key = gather(gpu, &key, 8, &p2).map_err(fail)?;
    Ok((sorted, key))
}

/// The first of `rows` rows sorted by (key, ts) at or after (k, x): a
/// bisection on the host, two 8-byte reads of the device a step (a few
/// dozen for a splitter or a lookback bound).
fn lower_bound_pair(
    key: &DeviceBuffer,
    ts: &DeviceBuffer,
    rows: usize,
    k: i64,
    x: i64,
) -> Result<usize, NodeError> {
    let (mut lo, mut hi) = (0, rows);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if (read_i64(key, mid)?, read_i64(ts, mid)?) < (k, x) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// Grouped step 1: this rank's run of the table globally sorted by (group
/// key, ts), as on the CPU path (equal pairs never split; one group's rows
/// may span ranks), with its group key as i64.
async fn global_sort_grouped(
    dc: &DeviceComm,
    t: DeviceTable,
    oi: usize,
    ki: usize,
    kty: NumType,
) -> Result<(DeviceTable, DeviceBuffer), NodeError> {
    let gpu = dc.gpu().clone();
    let (sorted, key) = sort_by_key_ts(&gpu, &t, oi, ki, kty)?;
    drop(t);
    let n = dc.nranks() as usize;
    if n == 1 {
        return Ok((sorted, key));
    }
    let rows = sorted.num_rows();
    let ts = &sorted.columns()[oi].data;
    let m = SAMPLES.min(rows);
    let mut samples = Vec::with_capacity(2 * m);
    for j in 0..m {
        samples.push(read_i64(&key, j * rows / m)?);
        samples.push(read_i64(ts, j * rows / m)?);
    }
    let mut bounds = vec![0usize];
    for s in sample_splitters(dc, samples, 2, rows).await? {
        let (k, x) = (
            s.first().copied().unwrap_or(0),
            s.get(1).copied().unwrap_or(0),
        );
        bounds.push(lower_bound_pair(&key, ts, rows, k, x)?);
    }
    bounds.resize(n + 1, rows);
    let got = exchange_rows(dc, &sorted, &bounds).await?;
    drop((sorted, key));
    sort_by_key_ts(&gpu, &got, oi, ki, kty)
}

/// The kernel's inputs of one rank: order values, then per value column
/// (f64 values, validity), all on the device; rows `0..ghost` are lookback.
struct Narrow {
    table: DeviceTable,
    ghost: usize,
}

/// The narrow table (ts, then each value as f64, then the group key as
/// i64 where given) of `t`.
fn narrow(
    gpu: &Arc<Gpu>,
    t: &DeviceTable,
    spec: &RollingSpec,
    oi: usize,
    key: Option<&DeviceBuffer>,
) -> Result<DeviceTable, NodeError> {
    let schema = t.schema();
    let mut fields = vec![Field::new("ts", DataType::Int64, false)];
    let mut cols = vec![DeviceColumn {
        data: t.columns()[oi].data.try_clone().map_err(fail)?,
        valid: None,
    }];
    for v in &spec.values {
        let i = column_index(schema, v)?;
        let ty = num_type(schema.field(i).data_type())
            .ok_or_else(|| fail(format!("value column {v:?} is not numeric")))?;
        let c = &t.columns()[i];
        fields.push(Field::new(v, DataType::Float64, true));
        cols.push(DeviceColumn {
            data: cast_to_f64(gpu, &c.data, ty).map_err(fail)?,
            valid: c
                .valid
                .as_ref()
                .map(|b| b.try_clone())
                .transpose()
                .map_err(fail)?,
        });
    }
    if let Some(k) = key {
        fields.push(Field::new("key", DataType::Int64, false));
        cols.push(DeviceColumn {
            data: k.try_clone().map_err(fail)?,
            valid: None,
        });
    }
    DeviceTable::new(gpu, Arc::new(Schema::new(fields)), cols, t.num_rows()).map_err(fail)
}

/// How the rows of a narrow table are sorted, for [`lookback`]'s
/// suffixes.
enum Order<'a> {
    /// By ts: the rows' u64 order keys (`order_key_i64`).
    Ts(&'a DeviceBuffer),
    /// By (group key, ts): the key is the narrow table's last column.
    KeyTs,
}

/// Step 2: the lookback rows from lower ranks (HaloExchange rounds, the
/// same plan as the CPU path's; grouped, of this rank's first group).
async fn lookback(
    dc: &DeviceComm,
    own: DeviceTable,
    order: Order<'_>,
    spec: &RollingSpec,
) -> Result<Narrow, NodeError> {
    let gpu = dc.gpu().clone();
    let (me, n) = (dc.rank() as usize, dc.nranks() as usize);
    let rows_me = own.num_rows();
    let ki = own.columns().len().saturating_sub(1);
    let ts = &own.columns()[0].data;
    let grouped = matches!(order, Order::KeyTs);
    let mut mine = vec![rows_me as i64, 0, 0, 0, 0];
    if rows_me > 0 {
        mine[1] = read_i64(ts, 0)?;
        mine[2] = read_i64(ts, rows_me - 1)?;
        if grouped {
            let key = &own.columns()[ki].data;
            mine[3] = read_i64(key, 0)?;
            mine[4] = read_i64(key, rows_me - 1)?;
        }
    }
    let all = allgather(dc.ctx(), mine).await.map_err(fail)?;
    if all.len() != 5 * n {
        return Err(fail(format!(
            "rank {me}: the ranks' lookback bounds came as {} values, not {}",
            all.len(),
            5 * n
        )));
    }
    let info: Vec<i64> = all.chunks_exact(5).flat_map(|c| c[..3].to_vec()).collect();
    // Group keys as bytes, compared for equality only (none on ranks
    // without rows: the plan never reads them).
    let keys: Vec<(Vec<u8>, Vec<u8>)> = if grouped {
        all.chunks_exact(5)
            .map(|c| match c[0] {
                0 => (Vec::new(), Vec::new()),
                _ => (c[3].to_le_bytes().to_vec(), c[4].to_le_bytes().to_vec()),
            })
            .collect()
    } else {
        Vec::new()
    };
    let plan = crate::rolling::HaloPlan::with_groups(&info, keys, n, spec).map_err(fail)?;
    let key_of = |k: Option<&[u8]>| -> Option<i64> {
        k.and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(i64::from_le_bytes)
    };
    // Rows of a sorted narrow table from (`key`, `from`) on (from `from`
    // ungrouped; `ts_keys`: its u64 order keys).
    let suffix = |t: &DeviceTable,
                  ts_keys: Option<&DeviceBuffer>,
                  key: Option<i64>,
                  from: Option<i64>|
     -> Result<DeviceTable, NodeError> {
        let start = match (from, ts_keys, key) {
            (None, _, _) => t.num_rows(),
            (Some(x), Some(k), _) => {
                let q = DeviceBuffer::from_slice(&gpu, &[(x as u64) ^ (1 << 63)]).map_err(fail)?;
                let at: Vec<u64> = lower_bound(&gpu, k, &q)
                    .map_err(fail)?
                    .to_vec()
                    .map_err(fail)?;
                at[0] as usize
            }
            (Some(x), None, Some(k)) => {
                let cols = t.columns();
                lower_bound_pair(&cols[ki].data, &cols[0].data, t.num_rows(), k, x)?
            }
            // Grouped, and no rank to the right with rows: nothing.
            (Some(_), None, None) => t.num_rows(),
        };
        t.slice(&gpu, start, t.num_rows() - start).map_err(fail)
    };
    let schema = own.schema().clone();
    let own_keys = match order {
        Order::Ts(k) => Some(k),
        Order::KeyTs => None,
    };
    let mut to_pass = suffix(
        &own,
        own_keys,
        key_of(plan.pass_key(me)),
        plan.pass_from(me),
    )?;
    let mut ghosts: Vec<DeviceTable> = Vec::new();
    for _ in 0..plan.rounds {
        let out = to_pass.pack(&gpu).map_err(fail)?;
        let halo = DeviceHaloExchange::new(dc)
            .exchange(None, Some(&out))
            .await
            .map_err(fail)?;
        let got = match halo.from_left {
            Some(b) if !b.is_empty() => {
                DeviceTable::unpack(&gpu, schema.clone(), &b).map_err(fail)?
            }
            _ => own.slice(&gpu, 0, 0).map_err(fail)?,
        };
        let got_keys = if grouped {
            None
        } else {
            Some(order_key_i64(&gpu, &got.columns()[0].data).map_err(fail)?)
        };
        if plan.rows(me) > 0 {
            let need = Some(plan.need(me));
            ghosts.push(suffix(
                &got,
                got_keys.as_ref(),
                key_of(plan.own_key(me)),
                need,
            )?);
        }
        to_pass = suffix(
            &got,
            got_keys.as_ref(),
            key_of(plan.pass_key(me)),
            plan.pass_from(me),
        )?;
    }
    // Later rounds hold older rows: put them first.
    ghosts.reverse();
    let ghost: usize = ghosts.iter().map(DeviceTable::num_rows).sum();
    let mut parts: Vec<(&DeviceTable, usize, usize)> =
        ghosts.iter().map(|g| (g, 0, g.num_rows())).collect();
    parts.push((&own, 0, rows_me));
    let table = DeviceTable::concat_ranges(&gpu, schema, &parts).map_err(fail)?;
    Ok(Narrow { table, ghost })
}

/// Runs the rolling aggregation on the device: takes device (or host)
/// chunks on `input`, sends device chunks of the output on `output`. Every
/// column travels on the device ([`Columns::AllOnDevice`]).
pub async fn gpu_rolling_node(
    dc: DeviceComm,
    spec: RollingSpec,
    schema: SchemaRef,
    chunk_rows: usize,
    mut input: Receiver,
    mut output: Sender,
) -> Result<(), NodeError> {
    check_gpu_spec(&spec, &schema, Columns::AllOnDevice)?;
    let out_schema = spec.output_schema(&schema)?;
    let gpu = dc.gpu().clone();
    let mut chunks = Vec::new();
    while let Some(m) = input.recv().await {
        match m.payload {
            Payload::Device(t) => chunks.push(t),
            Payload::Table(t) => {
                chunks.push(DeviceTable::from_batch(&gpu, t.batch()).map_err(fail)?)
            }
            Payload::Packed(_) => return Err(fail("gpu rolling got a non-table message")),
        }
    }
    let parts: Vec<(&DeviceTable, usize, usize)> =
        chunks.iter().map(|c| (c, 0, c.num_rows())).collect();
    let table = DeviceTable::concat_ranges(&gpu, schema.clone(), &parts).map_err(fail)?;
    drop(chunks);
    let rolled = roll(&dc, &spec, &schema, table).await?;
    let t = std::time::Instant::now();
    let rows = rolled.sorted.num_rows();
    let mut cols = rolled.sorted.into_columns().map_err(fail)?;
    cols.extend(rolled.aggs);
    let out = DeviceTable::new(&gpu, out_schema, cols, rows).map_err(fail)?;
    let chunk = chunk_rows.max(1);
    let mut seq = 0;
    let mut s = 0;
    while s < rows {
        let e = (s + chunk).min(rows);
        let part = if s == 0 && e == rows {
            out.clone()
        } else {
            out.slice(&gpu, s, e - s).map_err(fail)?
        };
        output
            .send(Message::new(seq, Payload::Device(part)))
            .await?;
        seq += 1;
        s = e;
    }
    dc.ctx()
        .statistics()
        .record_op("gpu rolling: emit", t.elapsed());
    Ok(())
}

/// The rolling job's GPU node ([`Columns::Needed`]): opens this rank's GPU
/// and the NCCL communicator (and compiles or loads the kernels) while the
/// host chunks stream in, so that start-up overlaps reading the input.
/// Only the order, group and value columns (and each row's origin) go to
/// the device; the aggregates come back to the rank that read the row,
/// which sends its own host chunks out with the aggregate columns added.
///
/// ```text
///   host chunks ──> core table: order, group code, values, origin
///                   (origin = rank << 40 | row; the group column as is
///                   when it is an integer column without nulls, else as
///                   codes of one dictionary that every rank builds alike)
///               ──> device: sort or shuffle, lookback, kernel (`roll`)
///               ──> (origin, aggregates) back to the origin rank
///                   (device AllToAllv), sorted by origin
///               ──> host: own chunks ++ aggregate columns
/// ```
pub async fn gpu_rolling_job_node(
    ctx: braid_core::Context,
    spec: RollingSpec,
    schema: SchemaRef,
    mut input: Receiver,
    mut output: Sender,
) -> Result<(), NodeError> {
    check_gpu_spec(&spec, &schema, Columns::Needed)?;
    let out_schema = spec.output_schema(&schema)?;
    let stats = ctx.statistics().clone();
    let init = async {
        let t = std::time::Instant::now();
        let rank = ctx.rank();
        let gpu = tokio::task::spawn_blocking(move || Gpu::for_rank(rank))
            .await
            .map_err(NodeError::other)?
            .map_err(fail)?;
        stats.record_op("gpu: device context", t.elapsed());
        let t1 = std::time::Instant::now();
        let dc = DeviceComm::new(&ctx, gpu.clone()).await.map_err(fail)?;
        stats.record_op("gpu: device communicator", t1.elapsed());
        let t1 = std::time::Instant::now();
        let g2 = gpu.clone();
        tokio::task::spawn_blocking(move || braid_kernels::gpu::Kernels::get(&g2))
            .await
            .map_err(NodeError::other)?
            .map_err(fail)?;
        stats.record_op("gpu: kernels loaded", t1.elapsed());
        stats.record_op("gpu: device, NCCL and kernels ready", t.elapsed());
        Ok::<_, NodeError>(dc)
    };
    let collect = async {
        let t = std::time::Instant::now();
        let mut host = Vec::new();
        while let Some(m) = input.recv().await {
            match m.payload {
                Payload::Table(t) => host.push(t.into_batch()),
                Payload::Device(t) => host.push(t.to_batch().map_err(fail)?),
                Payload::Packed(_) => return Err(fail("gpu rolling got a non-table message")),
            }
        }
        stats.record_op("gpu rolling: input in", t.elapsed());
        Ok(host)
    };
    let (dc, host) = futures::try_join!(init, collect)?;
    let rows: usize = host.iter().map(RecordBatch::num_rows).sum();
    let t = std::time::Instant::now();
    let core = core_table(&dc, &spec, &schema, &host).await?;
    stats.record_op("gpu rolling: core table to device", t.elapsed());
    let rolled = roll(&dc, &core.spec, &core.schema, core.table).await?;
    let t = std::time::Instant::now();
    let first_agg = schema.fields().len();
    let agg_fields: Vec<FieldRef> = out_schema.fields()[first_agg..].to_vec();
    let home = to_origin(&dc, rolled, agg_fields, rows).await?;
    stats.record_op("gpu rolling: aggregates home", t.elapsed());
    let t = std::time::Instant::now();
    emit(&dc, &home, host, &out_schema, &mut output, &stats).await?;
    stats.record_op("gpu rolling: download and emit", t.elapsed());
    Ok(())
}

/// Rows of aggregates downloaded in one go by [`emit`]: 1Mi rows is 8 MiB
/// of each 8-byte column, where a transfer's fixed cost (tens of
/// microseconds) is well below its time (hundreds), and a slab of origin
/// and seven aggregates (about 72 MiB) leaves room for several in the
/// device's pinned pool while the chunks of earlier ones are downstream.
const EMIT_SLAB_ROWS: usize = 1 << 20;

/// Sends this rank's input chunks out with their aggregate columns added,
/// in input order. The aggregates (`home`: origin, then aggregates, one row
/// per input row in input order) come to the host a slab of whole chunks at
/// a time ([`EMIT_SLAB_ROWS`], or one larger chunk), and each chunk's rows
/// are a zero-copy slice of its slab. Every row's origin is checked.
async fn emit(
    dc: &DeviceComm,
    home: &DeviceTable,
    host: Vec<RecordBatch>,
    out_schema: &SchemaRef,
    output: &mut Sender,
    stats: &braid_core::Statistics,
) -> Result<(), NodeError> {
    let base = u64::from(dc.rank()) << ORIGIN_ROW_BITS;
    // Slabs: whole input chunks, up to EMIT_SLAB_ROWS rows each (one
    // chunk at least).
    struct Slab {
        at: usize,
        rows: usize,
        chunks: Vec<RecordBatch>,
    }
    let mut slabs: Vec<Slab> = Vec::new();
    let mut at = 0;
    for b in host {
        let n = b.num_rows();
        match slabs.last_mut() {
            Some(s) if s.rows + n <= EMIT_SLAB_ROWS => {
                s.rows += n;
                s.chunks.push(b);
            }
            _ => slabs.push(Slab {
                at,
                rows: n,
                chunks: vec![b],
            }),
        }
        at += n;
    }
    // The next slab's copies are enqueued before this one is finished, so
    // they run while the host checks, slices and sends this one.
    // Each step's time is in the statistics (per slab: count and total).
    let start = |s: &Slab| {
        let t = std::time::Instant::now();
        let r = home.start_rows(s.at, s.rows).map_err(fail);
        stats.record_op("gpu rolling: emit: start copies", t.elapsed());
        r
    };
    let mut next = slabs.first().map(start).transpose()?;
    let mut seq = 0u64;
    for i in 0..slabs.len() {
        let Some(cur) = next.take() else { break };
        next = slabs.get(i + 1).map(start).transpose()?;
        let at = slabs[i].at;
        let slab = std::mem::take(&mut slabs[i].chunks);
        let t = std::time::Instant::now();
        let aggs = cur.finish().map_err(fail)?;
        stats.record_op("gpu rolling: emit: wait and to Arrow", t.elapsed());
        let t = std::time::Instant::now();
        let origins = aggs
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| fail(format!("rank {}: origin column is not i64", dc.rank())))?;
        let first = base + at as u64;
        // Branch-free over the slab (it vectorises: 0.2 s a 100M-row job
        // as a search, 2026-11-27); the position only on a mismatch.
        let mismatch = origins
            .values()
            .iter()
            .zip(first..)
            .fold(0u64, |acc, (&o, want)| acc | (o as u64 ^ want));
        if let Some(i) = (mismatch != 0)
            .then(|| {
                origins
                    .values()
                    .iter()
                    .zip(first..)
                    .position(|(&o, want)| o as u64 != want)
            })
            .flatten()
        {
            return Err(fail(format!(
                "rank {}: row {} got the aggregates of origin {:#x}",
                dc.rank(),
                at + i,
                origins.value(i)
            )));
        }
        stats.record_op("gpu rolling: emit: origin check", t.elapsed());
        let t = std::time::Instant::now();
        let mut off = 0;
        for b in slab {
            let len = b.num_rows();
            let mut cols = b.columns().to_vec();
            cols.extend(aggs.columns()[1..].iter().map(|c| c.slice(off, len)));
            off += len;
            let out = RecordBatch::try_new(out_schema.clone(), cols).map_err(fail)?;
            output.send(Message::new(seq, Payload::from(out))).await?;
            seq += 1;
        }
        stats.record_op("gpu rolling: emit: chunks sent", t.elapsed());
    }
    Ok(())
}

/// The core table's name for each row's origin (`rank << ORIGIN_ROW_BITS |
/// row`, row counted over the rank's input chunks).
const ORIGIN: &str = "__braid_origin";
/// The core table's name for the group column (as is, or as codes).
const GROUP: &str = "__braid_group";
/// Bits of the row in an origin: 2^40 rows per rank.
const ORIGIN_ROW_BITS: u32 = 40;

/// What goes to the device in the job: the spec and schema over the core
/// columns, and this rank's core table on the device.
struct Core {
    spec: RollingSpec,
    schema: SchemaRef,
    table: DeviceTable,
}

/// This rank's core table (order, group, values, origin) on the device, its
/// chunks one after another.
async fn core_table(
    dc: &DeviceComm,
    spec: &RollingSpec,
    schema: &SchemaRef,
    host: &[RecordBatch],
) -> Result<Core, NodeError> {
    let gpu = dc.gpu().clone();
    let rank = u64::from(dc.rank());
    let rows: usize = host.iter().map(RecordBatch::num_rows).sum();
    if rows as u64 >= 1 << ORIGIN_ROW_BITS {
        return Err(fail(format!(
            "rank {rank}: {rows} rows is more than the GPU job's 2^{ORIGIN_ROW_BITS} per rank"
        )));
    }
    let oi = column_index(schema, &spec.order)?;
    let vis: Vec<usize> = spec
        .values
        .iter()
        .map(|v| column_index(schema, v))
        .collect::<Result<_, _>>()?;
    let groups = if spec.by.is_empty() {
        None
    } else {
        let kis: Vec<usize> = spec
            .by
            .iter()
            .map(|b| column_index(schema, b))
            .collect::<Result<_, _>>()?;
        let fields: Vec<&Field> = kis.iter().map(|&k| schema.field(k)).collect();
        let keys: Vec<Vec<ArrayRef>> = host
            .iter()
            .map(|b| kis.iter().map(|&k| b.column(k).clone()).collect())
            .collect();
        Some(group_codes(dc.ctx(), &fields, keys).await?)
    };
    // The device sorts and compares the order column as i64.
    let order = schema.field(oi);
    let mut fields: Vec<FieldRef> = vec![Arc::new(Field::new(
        order.name(),
        DataType::Int64,
        order.is_nullable(),
    ))];
    if let Some(g) = &groups {
        fields.push(Arc::new(Field::new(GROUP, g.data_type.clone(), false)));
    }
    // Value columns the device has no form for (decimals, f16) go as f64,
    // which is how the kernel reads every value.
    let on_host_f64 = |t: &DataType| num_type(t).is_none();
    fields.extend(vis.iter().map(|&i| {
        let f = &schema.fields()[i];
        if on_host_f64(f.data_type()) {
            Arc::new(f.as_ref().clone().with_data_type(DataType::Float64))
        } else {
            f.clone()
        }
    }));
    let host_schema = Arc::new(Schema::new(fields.clone()));
    fields.push(Arc::new(Field::new(ORIGIN, DataType::Int64, false)));
    let core_schema = Arc::new(Schema::new(fields));
    let mut batches = Vec::with_capacity(host.len());
    for (i, b) in host.iter().enumerate() {
        let mut cols: Vec<ArrayRef> = vec![order_as_i64(b.column(oi), &spec.order)?];
        if let Some(g) = &groups {
            cols.push(g.codes[i].clone());
        }
        for &v in &vis {
            let c = b.column(v);
            cols.push(if on_host_f64(c.data_type()) {
                arrow_cast::cast(c, &DataType::Float64).map_err(fail)?
            } else {
                c.clone()
            });
        }
        batches.push(RecordBatch::try_new(host_schema.clone(), cols).map_err(fail)?);
    }
    let table = DeviceTable::from_batches(&gpu, host_schema, &batches).map_err(fail)?;
    // Origins are made on the device: rows are numbered over the chunks.
    let origin = iota_i64(&gpu, (rank << ORIGIN_ROW_BITS) as i64, rows).map_err(fail)?;
    let mut columns = table.into_columns().map_err(fail)?;
    columns.push(DeviceColumn {
        data: origin,
        valid: None,
    });
    let table = DeviceTable::new(&gpu, core_schema.clone(), columns, rows).map_err(fail)?;
    let core_spec = RollingSpec {
        by: if spec.by.is_empty() {
            Vec::new()
        } else {
            vec![GROUP.to_string()]
        },
        ..spec.clone()
    };
    Ok(Core {
        spec: core_spec,
        schema: core_schema,
        table,
    })
}

/// The group column in a form the device sorts and the kernel compares:
/// equal exactly where the keys are equal (nulls one group of their own),
/// the same on every rank.
struct GroupCodes {
    data_type: DataType,
    /// Per input chunk.
    codes: Vec<ArrayRef>,
}

/// One integer group column without nulls on any rank is its own code (the
/// device casts it to i64). Any other key (strings, floats, nulls, or
/// several group columns) becomes the index of its key in the sorted union
/// of every rank's distinct keys in Arrow's row format, which every rank
/// gathers (one AllGather of the distinct keys: cheap for the usual few
/// thousand groups, and exact). `keys` holds each input chunk's group
/// columns, in the order of `fields`.
async fn group_codes(
    ctx: &braid_core::Context,
    fields: &[&Field],
    keys: Vec<Vec<ArrayRef>>,
) -> Result<GroupCodes, NodeError> {
    let names: Vec<&String> = fields.iter().map(|f| f.name()).collect();
    let nulls_here = keys.iter().flatten().any(|k| k.null_count() > 0);
    // Every rank must pick the same form, so the null check is global.
    let nulls = allgather(ctx, vec![i64::from(nulls_here)])
        .await
        .map_err(fail)?
        .iter()
        .any(|x| *x != 0);
    if let [field] = fields {
        if !nulls && num_type(field.data_type()).is_some_and(NumType::is_integer) {
            return Ok(GroupCodes {
                data_type: field.data_type().clone(),
                codes: keys.into_iter().flatten().collect(),
            });
        }
    }
    // Float keys group as DuckDB and Polars group them (one 0.0, one NaN).
    let keys: Vec<Vec<ArrayRef>> = keys
        .into_iter()
        .map(|chunk| {
            chunk
                .into_iter()
                .map(|k| Ok(canonical_group_key(&k)?.unwrap_or(k)))
                .collect::<Result<_, DataError>>()
        })
        .collect::<Result<_, DataError>>()?;
    let conv = RowConverter::new(
        fields
            .iter()
            .map(|f| SortField::new(group_key_type(f.data_type())))
            .collect(),
    )
    .map_err(fail)?;
    let rows: Vec<Rows> = keys
        .iter()
        .map(|k| conv.convert_columns(k))
        .collect::<Result<_, _>>()
        .map_err(fail)?;
    let mut mine: Vec<&[u8]> = rows
        .iter()
        .flat_map(|r| r.iter().map(|x| x.data()))
        .collect::<HashSet<&[u8]>>()
        .into_iter()
        .collect();
    mine.sort_unstable();
    let mut bytes = Vec::new();
    for k in &mine {
        bytes.extend_from_slice(&(k.len() as u64).to_le_bytes());
        bytes.extend_from_slice(k);
    }
    let all = allgather(ctx, bytes).await.map_err(fail)?;
    let mut dict: Vec<&[u8]> = Vec::new();
    let mut i = 0;
    while i < all.len() {
        let len = all
            .get(i..i + 8)
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map(u64::from_le_bytes)
            .and_then(|l| usize::try_from(l).ok())
            .filter(|l| i + 8 + l <= all.len())
            .ok_or_else(|| {
                fail(format!(
                    "rank {}: the gathered keys of group columns {names:?} are malformed",
                    ctx.rank(),
                ))
            })?;
        dict.push(&all[i + 8..i + 8 + len]);
        i += 8 + len;
    }
    dict.sort_unstable();
    dict.dedup();
    let index: HashMap<&[u8], i64> = dict
        .iter()
        .enumerate()
        .map(|(c, k)| (*k, c as i64))
        .collect();
    let codes = rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|x| index.get(x.data()).copied())
                .collect::<Option<Int64Array>>()
                .map(|a| Arc::new(a) as ArrayRef)
                .ok_or_else(|| {
                    fail(format!(
                        "rank {}: a key of group columns {names:?} is missing from the gathered keys",
                        ctx.rank(),
                    ))
                })
        })
        .collect::<Result<_, _>>()?;
    Ok(GroupCodes {
        data_type: DataType::Int64,
        codes,
    })
}

/// This rank's rows after the kernel: `sorted` (by the order column, or by
/// group and then order), and the aggregate columns of those rows.
struct Rolled {
    sorted: DeviceTable,
    aggs: Vec<DeviceColumn>,
}

/// Sends each row's aggregates back to the rank it came from (the origin
/// column, last in `rolled.sorted`) and returns this rank's on the device,
/// (origin, aggregates) in its input order, one row per input row (the
/// count checked here, each row's origin as it is read out).
async fn to_origin(
    dc: &DeviceComm,
    rolled: Rolled,
    agg_fields: Vec<FieldRef>,
    rows: usize,
) -> Result<DeviceTable, NodeError> {
    let gpu = dc.gpu().clone();
    let (me, n) = (u64::from(dc.rank()), dc.nranks() as usize);
    let m = rolled.sorted.num_rows();
    let oc = rolled.sorted.columns().len() - 1;
    let origin = rolled.sorted.columns()[oc].data.try_clone().map_err(fail)?;
    drop(rolled.sorted);
    let mut fields: Vec<FieldRef> = vec![Arc::new(Field::new(ORIGIN, DataType::Int64, false))];
    fields.extend(agg_fields);
    let mut cols = vec![DeviceColumn {
        data: origin,
        valid: None,
    }];
    cols.extend(rolled.aggs);
    let back = DeviceTable::new(&gpu, Arc::new(Schema::new(fields)), cols, m).map_err(fail)?;
    let back = if n > 1 {
        let (keys, perm) = sort_perm_i64(&gpu, &back.columns()[0].data, None)?;
        let by_dest = gather_table(&gpu, &back, &perm)?;
        drop(back);
        let firsts: Vec<u64> = (1..n as u64)
            .map(|r| (r << ORIGIN_ROW_BITS) ^ (1 << 63))
            .collect();
        let bounds = split_bounds(&gpu, &keys, &firsts, m)?;
        exchange_rows(dc, &by_dest, &bounds).await?
    } else {
        back
    };
    let (_, perm) = sort_perm_i64(&gpu, &back.columns()[0].data, None)?;
    let mine = gather_table(&gpu, &back, &perm)?;
    if mine.num_rows() != rows {
        return Err(fail(format!(
            "rank {me}: {} aggregate rows came back for {rows} input rows",
            mine.num_rows()
        )));
    }
    Ok(mine)
}

/// The GPU rolling computation over this rank's device table: sorted (or
/// shuffled and sorted) rows and their aggregates, still on the device.
async fn roll(
    dc: &DeviceComm,
    spec: &RollingSpec,
    schema: &SchemaRef,
    table: DeviceTable,
) -> Result<Rolled, NodeError> {
    let gpu = dc.gpu().clone();
    let stats = dc.ctx().statistics().clone();
    let t0 = std::time::Instant::now();
    let oi = column_index(schema, &spec.order)?;
    if table.columns()[oi].valid.is_some() {
        return Err(
            DataError::Invalid(format!("order column {:?} has null values", spec.order)).into(),
        );
    }
    let (sorted, narrow_t, keyed, ghost) = match spec.by.as_slice() {
        [] => {
            let (sorted, keys) = global_sort(dc, table, oi).await?;
            stats.record_op("gpu rolling: distributed sort", t0.elapsed());
            let t1 = std::time::Instant::now();
            let nt = narrow(&gpu, &sorted, spec, oi, None)?;
            let Narrow { table, ghost } = lookback(dc, nt, Order::Ts(&keys), spec).await?;
            stats.record_op("gpu rolling: lookback rounds", t1.elapsed());
            (sorted, table, false, ghost)
        }
        [by] => {
            let ki = column_index(schema, by)?;
            let kty = num_type(schema.field(ki).data_type())
                .filter(|t| t.is_integer())
                .ok_or_else(|| fail(format!("group column {by:?} is not an integer column")))?;
            if table.columns()[ki].valid.is_some() {
                return Err(DataError::Invalid(format!(
                    "group column {by:?} has null values (not supported on the GPU)"
                ))
                .into());
            }
            let (sorted, key) = global_sort_grouped(dc, table, oi, ki, kty).await?;
            stats.record_op("gpu rolling: distributed sort", t0.elapsed());
            let t1 = std::time::Instant::now();
            let nt = narrow(&gpu, &sorted, spec, oi, Some(&key))?;
            drop(key);
            let Narrow { table, ghost } = lookback(dc, nt, Order::KeyTs, spec).await?;
            stats.record_op("gpu rolling: lookback rounds", t1.elapsed());
            (sorted, table, true, ghost)
        }
        // `prepare` codes several group columns as one.
        _ => {
            return Err(fail(format!(
                "the device rolling core takes one (coded) group column, not {:?}",
                spec.by
            )));
        }
    };
    // The kernel, one value column at a time; outputs stay on the device.
    let t2 = std::time::Instant::now();
    let mut aggs: Vec<DeviceColumn> = Vec::new();
    for vi in 0..spec.values.len() {
        let c = &narrow_t.columns()[vi + 1];
        let input = RollingInput {
            ts: &narrow_t.columns()[0].data,
            // Grouped, the key of ghost rows ++ own rows: the last column.
            key: keyed.then(|| &narrow_t.columns()[spec.values.len() + 1].data),
            values: &c.data,
            valid: c.valid.as_ref(),
            emit_from: ghost,
        };
        for col in rolling(&gpu, input, spec.window, spec.closed, &spec.aggs).map_err(fail)? {
            aggs.push(DeviceColumn {
                data: col.values,
                valid: col.valid,
            });
        }
    }
    stats.record_op("gpu rolling: kernel", t2.elapsed());
    Ok(Rolled { sorted, aggs })
}
