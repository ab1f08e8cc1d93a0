//! The rolling-window aggregation of a distributed table.
//!
//! Ungrouped:
//!
//! ```text
//!   1. distributed sort by the order column (equal ts never split)
//!   2. AllGather of (rows, min ts, max ts) per rank: every rank knows which
//!      lower ranks hold rows inside its first window, hence how many
//!      HaloExchange rounds the job needs (decided at run time)
//!   3. round 1: each rank sends right its rows that some rank to its right
//!      needs; round k: it forwards what it got in round k-1 (rows of rank
//!      r-k+1) if still needed further right. Each rank keeps what it needs.
//!   4. one pass of the rolling kernel over ghost rows ++ own rows, output
//!      for own rows only
//! ```
//!
//! Grouped: hash shuffle by the group column (whole groups on one rank),
//! sort by (group, ts) locally, one kernel pass per group.
//!
//! Output: every input row once, all input columns kept, plus
//! `<value>_<agg>` (float64; count is int64), in chunks of `chunk_rows`.
//!
//! Memory: the rank's sorted partition, its ghost rows and the output
//! columns are held at once (the sort needs the partition anyway); the
//! shuffle inside the sort spills over the host limit.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Float64Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use arrow_select::concat::concat_batches;
use braid_coll::{HaloExchange, allgather};
use braid_core::{Context, Message, NodeError, PackedData, Payload, Receiver, Sender};
use braid_kernels::rolling::{Agg, Closed, rolling, rolling_segments};

use crate::error::{DataError, Result};
use crate::ipc::{pack, unpack};
use crate::partition::column_index;
use crate::shuffle::hash_shuffle;
use crate::sort::{DistributedSort, SortKey, local_sort};

/// What to compute.
#[derive(Debug, Clone)]
pub struct RollingSpec {
    /// The order column (int64 or timestamp).
    pub order: String,
    /// The group column, if grouped.
    pub by: Option<String>,
    /// Value columns (numeric).
    pub values: Vec<String>,
    /// Window length in the order column's units.
    pub window: i64,
    /// Which window ends are closed.
    pub closed: Closed,
    /// Aggregations.
    pub aggs: Vec<Agg>,
}

fn is_numeric(t: &DataType) -> bool {
    t.is_numeric() && !matches!(t, DataType::Decimal32(..) | DataType::Decimal64(..))
}

impl RollingSpec {
    /// Checks the spec against the input schema (clear errors before any
    /// work) and returns the output schema.
    pub fn output_schema(&self, schema: &Schema) -> Result<SchemaRef> {
        if self.window < 0 {
            return Err(DataError::Invalid(format!(
                "window must be >= 0, got {}",
                self.window
            )));
        }
        if self.values.is_empty() {
            return Err(DataError::Invalid("no value columns given".into()));
        }
        if self.aggs.is_empty() {
            return Err(DataError::Invalid("no aggregations given".into()));
        }
        let o = column_index(schema, &self.order)?;
        let ot = schema.field(o).data_type();
        if !matches!(ot, DataType::Int64 | DataType::Timestamp(..)) {
            return Err(DataError::WrongType {
                name: self.order.clone(),
                found: ot.to_string(),
                expected: "Int64 or Timestamp".into(),
            });
        }
        if let Some(by) = &self.by {
            column_index(schema, by)?;
        }
        let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
        for v in &self.values {
            let i = column_index(schema, v)?;
            let t = schema.field(i).data_type();
            if !is_numeric(t) {
                return Err(DataError::WrongType {
                    name: v.clone(),
                    found: t.to_string(),
                    expected: "a numeric type".into(),
                });
            }
            for a in &self.aggs {
                let name = format!("{v}_{}", a.name());
                if schema.index_of(&name).is_ok() {
                    return Err(DataError::Invalid(format!(
                        "input already has a column named {name:?}"
                    )));
                }
                let dt = if *a == Agg::Count {
                    DataType::Int64
                } else {
                    DataType::Float64
                };
                fields.push(Arc::new(Field::new(name, dt, *a != Agg::Count)));
            }
        }
        Ok(Arc::new(Schema::new(fields)))
    }
}

/// The order column as i64 (timestamps by their stored integer).
fn order_values(batch: &RecordBatch, col: usize, name: &str) -> Result<Vec<i64>> {
    let a = batch.column(col);
    if a.null_count() > 0 {
        return Err(DataError::Invalid(format!(
            "order column {name:?} has {} null values",
            a.null_count()
        )));
    }
    let a = arrow_cast::cast(a, &DataType::Int64)?;
    let a = a
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| DataError::Invalid("order column cast failed".into()))?;
    Ok(a.values().to_vec())
}

/// A value column as f64 values and validity (None: no nulls).
fn value_columns(batch: &RecordBatch, col: usize) -> Result<(Vec<f64>, Option<Vec<bool>>)> {
    let a = arrow_cast::cast(batch.column(col), &DataType::Float64)?;
    let a = a
        .as_any()
        .downcast_ref::<Float64Array>()
        .ok_or_else(|| DataError::Invalid("value column cast failed".into()))?;
    let valid = a.nulls().map(|n| n.iter().collect());
    Ok((a.values().to_vec(), valid))
}

/// Runs the rolling aggregation: takes the table's chunks on `input`,
/// sends the result's chunks on `output`.
pub async fn rolling_node(
    ctx: Context,
    spec: RollingSpec,
    schema: SchemaRef,
    chunk_rows: usize,
    input: Receiver,
    mut output: Sender,
) -> Result<(), NodeError> {
    let out_schema = spec.output_schema(&schema)?;
    let result = match &spec.by {
        Some(by) => {
            let local = hash_shuffle(&ctx, schema.clone(), std::slice::from_ref(by), input).await?;
            let spec2 = spec.clone();
            let s2 = out_schema.clone();
            tokio::task::spawn_blocking(move || grouped(&local, &spec2, s2))
                .await
                .map_err(NodeError::other)??
        }
        None => {
            let mut input = input;
            let mut batches = Vec::new();
            while let Some(m) = input.recv().await {
                match m.payload {
                    Payload::Table(t) => batches.push(t.into_batch()),
                    Payload::Packed(_) => {
                        return Err(NodeError::other("rolling got a non-table message"));
                    }
                }
            }
            let sorted = DistributedSort::new(vec![SortKey::asc(&spec.order)])
                .sort(&ctx, schema.clone(), batches)
                .await?;
            ungrouped(&ctx, sorted, &spec, out_schema.clone()).await?
        }
    };
    let chunk_rows = chunk_rows.max(1);
    let mut off = 0;
    let mut seq = 0;
    while off < result.num_rows() {
        let len = chunk_rows.min(result.num_rows() - off);
        output
            .send(Message::new(seq, result.slice(off, len)))
            .await?;
        seq += 1;
        off += len;
    }
    Ok(())
}

/// Appends the aggregation columns to `batch`.
fn with_aggs(
    batch: &RecordBatch,
    out_schema: SchemaRef,
    cols: Vec<ArrayRef>,
) -> Result<RecordBatch> {
    let mut all: Vec<ArrayRef> = batch.columns().to_vec();
    all.extend(cols);
    Ok(RecordBatch::try_new(out_schema, all)?)
}

fn agg_array(agg: Agg, values: Vec<f64>, valid: Vec<bool>) -> ArrayRef {
    if agg == Agg::Count {
        Arc::new(Int64Array::from(
            values.into_iter().map(|c| c as i64).collect::<Vec<_>>(),
        ))
    } else {
        Arc::new(Float64Array::new(values.into(), Some(valid.into())))
    }
}

/// Grouped: `local` holds whole groups; sort by (group, ts), one kernel
/// pass per group.
fn grouped(local: &RecordBatch, spec: &RollingSpec, out_schema: SchemaRef) -> Result<RecordBatch> {
    let by = spec.by.clone().unwrap_or_default();
    let sorted = local_sort(local, &[SortKey::asc(&by), SortKey::asc(&spec.order)])?;
    let schema = sorted.schema();
    let ts = order_values(&sorted, column_index(&schema, &spec.order)?, &spec.order)?;
    let key = sorted.column(column_index(&schema, &by)?).clone();
    let ranges = arrow_ord::partition::partition(&[key])?.ranges();
    let mut offsets = Vec::with_capacity(ranges.len() + 1);
    offsets.push(0);
    offsets.extend(ranges.iter().map(|r| r.end));
    if sorted.num_rows() == 0 {
        offsets = vec![0, 0];
    }
    let mut cols = Vec::new();
    for v in &spec.values {
        let (vals, valid) = value_columns(&sorted, column_index(&schema, v)?)?;
        let r = rolling_segments(
            &ts,
            &vals,
            valid.as_deref(),
            &offsets,
            spec.window,
            spec.closed,
            &spec.aggs,
        )
        .map_err(|e| DataError::Invalid(e.to_string()))?;
        for c in r.columns {
            cols.push(agg_array(c.agg, c.values, c.valid));
        }
    }
    with_aggs(&sorted, out_schema, cols)
}

/// Ungrouped: `sorted` is this rank's run of the globally sorted table.
async fn ungrouped(
    ctx: &Context,
    sorted: RecordBatch,
    spec: &RollingSpec,
    out_schema: SchemaRef,
) -> Result<RecordBatch> {
    let (me, n) = (ctx.rank() as usize, ctx.nranks() as usize);
    let schema = sorted.schema();
    let oi = column_index(&schema, &spec.order)?;
    let ts = order_values(&sorted, oi, &spec.order)?;
    // 2. Everyone's (rows, min ts, max ts).
    let info = allgather(
        ctx,
        vec![
            ts.len() as i64,
            ts.first().copied().unwrap_or(0),
            ts.last().copied().unwrap_or(0),
        ],
    )
    .await?;
    let rows = |r: usize| info[3 * r];
    let tmin = |r: usize| info[3 * r + 1];
    let tmax = |r: usize| info[3 * r + 2];
    // Smallest ts rank r's first window needs (inclusive).
    let need = |r: usize| -> i64 {
        let lo = tmin(r).saturating_sub(spec.window);
        match spec.closed {
            Closed::Right | Closed::None => lo.saturating_add(1),
            Closed::Both | Closed::Left => lo,
        }
    };
    // What a rank must pass right: rows some rank further right needs.
    let pass_from =
        |r: usize| -> Option<i64> { (r + 1..n).filter(|j| rows(*j) > 0).map(need).min() };
    let rounds = (0..n)
        .filter(|j| rows(*j) > 0)
        .filter_map(|j| {
            (0..j)
                .find(|k| rows(*k) > 0 && tmax(*k) >= need(j))
                .map(|k| j - k)
        })
        .max()
        .unwrap_or(0);
    // 3. Halo rounds. Ghost batches hold the order and value columns only.
    let mut keep_cols = vec![oi];
    for v in &spec.values {
        keep_cols.push(column_index(&schema, v)?);
    }
    let narrow = sorted.project(&keep_cols)?;
    let narrow_schema = narrow.schema();
    let suffix_from = |b: &RecordBatch, t: &[i64], from: Option<i64>| -> RecordBatch {
        match from {
            None => b.slice(0, 0),
            Some(x) => {
                let start = t.partition_point(|v| *v < x);
                b.slice(start, b.num_rows() - start)
            }
        }
    };
    let mut to_pass = suffix_from(&narrow, &ts, pass_from(me));
    let mut ghosts: Vec<RecordBatch> = Vec::new(); // newest round first after reversal
    for _ in 0..rounds {
        let empty = PackedData {
            metadata: bytes::Bytes::new(),
            data: braid_core::Buffer::default(),
        };
        let out = pack(&to_pass)?;
        let halo = HaloExchange::new(ctx).exchange(empty, out).await?;
        let got = match halo.from_left {
            Some(p) if !p.data.is_empty() => concat_batches(&narrow_schema, &unpack(&p)?)?,
            _ => narrow.slice(0, 0),
        };
        let got_ts = order_values(&got, 0, &spec.order)?;
        if rows(me) > 0 {
            ghosts.push(suffix_from(&got, &got_ts, Some(need(me))));
        }
        to_pass = suffix_from(&got, &got_ts, pass_from(me));
    }
    // Later rounds hold older rows: put them first.
    ghosts.reverse();
    ghosts.push(narrow.clone());
    let all = concat_batches(&narrow_schema, &ghosts)?;
    let emit_from = all.num_rows() - narrow.num_rows();
    let spec2 = spec.clone();
    let cols = tokio::task::spawn_blocking(move || -> Result<Vec<ArrayRef>> {
        let all_ts = order_values(&all, 0, &spec2.order)?;
        let mut cols = Vec::new();
        for (k, _) in spec2.values.iter().enumerate() {
            let (vals, valid) = value_columns(&all, k + 1)?;
            let r = rolling(
                &all_ts,
                &vals,
                valid.as_deref(),
                spec2.window,
                spec2.closed,
                &spec2.aggs,
                emit_from,
            )
            .map_err(|e| DataError::Invalid(e.to_string()))?;
            for c in r.columns {
                cols.push(agg_array(c.agg, c.values, c.valid));
            }
        }
        Ok(cols)
    })
    .await
    .map_err(|e| DataError::Invalid(e.to_string()))??;
    with_aggs(&sorted, out_schema, cols)
}
