//! The rolling-window aggregation of a distributed table.
//!
//! ```text
//!   1. distributed sort by (group columns, order column): equal (group,
//!      ts) never split, but a group's rows may span several ranks, so a
//!      group with most of the rows still spreads over every rank
//!   2. AllGather of (rows, first ts, last ts, first group, last group)
//!      per rank: every rank knows which lower ranks hold rows inside its
//!      first window (only its first group can continue from below, and
//!      only from ranks whose last group it is), hence how many
//!      HaloExchange rounds the job needs (decided at run time)
//!   3. round 1: each rank sends right its rows that some rank to its right
//!      needs (of the group that starts the next rank with rows); round
//!      k: it forwards what it got in round k-1 (rows of rank r-k+1) if
//!      still needed further right. Each rank keeps what it needs.
//!   4. the rolling kernel over ghost rows ++ own rows, chunk by chunk,
//!      each group a segment (windows never cross one), output for own
//!      rows only
//! ```
//!
//! Ungrouped, the whole table is one group.
//!
//! Output: every input row once, all input columns kept, plus
//! `<value>_<agg>` (float64; count is int64), in chunks of at least
//! `chunk_rows` rows (but a rank's last): a chunk never splits a group's
//! run of equal order values, and holds at least twice the
//! lookback its first row needs (so that its lookback rows, read again,
//! stay at most a third of the work). Rows come out sorted by (group,
//! order) across the ranks.
//!
//! Memory: after the sort, the node adds to the rank's sorted partition
//! only its ghost rows, the chunks being computed and sent, and an i64
//! copy of the order column where it is not stored as i64 (Int64, Date64
//! and timestamps are read in place). Value columns are read in place
//! where Float64 and converted a chunk at a time otherwise; only a chunk
//! whose lookback reaches into the ghost rows copies its rows. The
//! shuffle inside the sort spills over the host limit.

use std::borrow::Cow;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Float64Array, Int64Array, RecordBatch};
use arrow_buffer::ScalarBuffer;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use arrow_select::concat::concat_batches;
use braid_coll::{HaloExchange, allgather_parts};
use braid_core::{Context, Message, NodeError, PackedData, Payload, Receiver, Sender};
use braid_kernels::rolling::{Agg, CalendarUnit, Closed, Segments, Window, rolling_segments};
use braid_kernels::window::Zone;

use crate::error::{DataError, Result};
use crate::ipc::{pack, unpack};
use crate::partition::{
    canonical_group_key, column_index, converter, group_key_type, is_float_key, key_rows,
};
use crate::sort::{DistributedSort, SortKey};
use crate::threads::{map_scoped, rank_threads};

/// What to compute.
#[derive(Debug, Clone)]
pub struct RollingSpec {
    /// The order column (any integer type, a date or a timestamp).
    pub order: String,
    /// The group columns (empty: ungrouped). A group is the rows that
    /// agree on all of them, as DuckDB's `PARTITION BY a, b` and Polars'
    /// `group_by=["a", "b"]` group.
    pub by: Vec<String>,
    /// Value columns (numeric).
    pub values: Vec<String>,
    /// How far back a window reaches: a length in the order column's units
    /// (`Window::Fixed`, also `1000.into()`), or calendar months on a
    /// timestamp or date column.
    pub window: Window,
    /// Which window ends are closed.
    pub closed: Closed,
    /// Aggregations.
    pub aggs: Vec<Agg>,
}

/// Order columns: every integer type, dates and timestamps (read as their
/// stored integer: days for Date32, milliseconds for Date64).
pub fn is_order_type(t: &DataType) -> bool {
    t.is_integer()
        || matches!(
            t,
            DataType::Date32 | DataType::Date64 | DataType::Timestamp(..)
        )
}

/// Value columns: every integer, float and decimal type (read as f64), and
/// the null type.
fn is_numeric(t: &DataType) -> bool {
    // The null type is what pyarrow gives a column of `None`s only: its
    // windows count 0, as any all-null column's (DuckDB reads it so).
    numbers(t) || *t == DataType::Null
}

/// Integers, floats and decimals, plain or dictionary-encoded (pyarrow's
/// `dictionary_encode()`, a Parquet column read with its dictionary kept):
/// read as f64 (the cast unpacks a dictionary), as DuckDB reads them.
pub(crate) fn numbers(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(_, v) => v.is_numeric(),
        t => t.is_numeric(),
    }
}

impl RollingSpec {
    /// Checks the spec against the input schema (clear errors before any
    /// work) and returns the output schema.
    pub fn output_schema(&self, schema: &Schema) -> Result<SchemaRef> {
        if self.window.length() < 0 {
            return Err(DataError::Invalid(format!(
                "window must be >= 0, got {}",
                self.window.length()
            )));
        }
        if self.values.is_empty() {
            return Err(DataError::Invalid("no value columns given".into()));
        }
        if self.aggs.is_empty() {
            return Err(DataError::Invalid("no aggregations given".into()));
        }
        // Each output column once: a repeated value or aggregation would
        // name two columns alike (a file many readers refuse).
        for (i, v) in self.values.iter().enumerate() {
            if self.values[..i].contains(v) {
                return Err(DataError::Invalid(format!(
                    "value column {v:?} is given twice"
                )));
            }
        }
        for (i, a) in self.aggs.iter().enumerate() {
            if self.aggs[..i].contains(a) {
                return Err(DataError::Invalid(format!(
                    "aggregation {} is given twice",
                    a.name()
                )));
            }
        }
        let o = column_index(schema, &self.order)?;
        let ot = schema.field(o).data_type();
        if !is_order_type(ot) {
            return Err(DataError::WrongType {
                name: self.order.clone(),
                found: ot.to_string(),
                expected: "an integer, Date32, Date64 or Timestamp type".into(),
            });
        }
        match self.window {
            Window::Calendar { unit, .. } => check_calendar(&self.order, ot, unit)?,
            Window::Zoned { unit, zone, .. } => check_zoned(&self.order, ot, unit, zone)?,
            Window::Fixed(_) => {}
        }
        for (i, by) in self.by.iter().enumerate() {
            column_index(schema, by)?;
            if self.by[..i].contains(by) {
                return Err(DataError::Invalid(format!(
                    "group column {by:?} is given twice"
                )));
            }
        }
        let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
        for v in &self.values {
            let i = column_index(schema, v)?;
            let t = schema.field(i).data_type();
            if !is_numeric(t) {
                return Err(DataError::WrongType {
                    name: v.clone(),
                    found: t.to_string(),
                    expected: "a numeric type (it is a value column, which the aggregations read)"
                        .into(),
                });
            }
            for a in &self.aggs {
                let name = format!("{v}_{}", a.name());
                if schema.index_of(&name).is_ok() {
                    return Err(DataError::Invalid(format!(
                        "input already has a column named {name:?}, the name the output gives the {} of value column {v:?} (the output keeps every input column: the names would clash)",
                        a.name()
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

/// A calendar window needs an order column whose stored integer counts
/// `unit` from the epoch in UTC: a date, or a timestamp without a time
/// zone or in UTC (months in another zone start at its local midnight,
/// which braid does not model).
fn check_calendar(order: &str, t: &DataType, unit: CalendarUnit) -> Result<()> {
    let (stored, tz) = stored_unit(t);
    if stored != Some(unit) {
        return Err(DataError::Invalid(format!(
            "a calendar window (months, quarters, years) needs a date or timestamp order column counting {unit:?}; {order:?} is {t}"
        )));
    }
    match tz {
        Some(z) if !z.parse::<Zone>().is_ok_and(Zone::is_utc) => Err(DataError::Invalid(format!(
            "a calendar window on order column {order:?} in time zone {z}: Window::Calendar steps on UTC's calendar; use Window::Zoned for the zone's local one"
        ))),
        _ => Ok(()),
    }
}

/// A window on a zone's local clock needs a timestamp column of `unit` in
/// that zone (its values are instants; the zone gives their local time).
fn check_zoned(order: &str, t: &DataType, unit: CalendarUnit, zone: Zone) -> Result<()> {
    match stored_unit(t) {
        (Some(u), Some(z)) if u == unit && z.parse::<Zone>().is_ok_and(|c| c == zone) => Ok(()),
        _ => Err(DataError::Invalid(format!(
            "a window on the local clock of time zone {zone} needs a timestamp order column counting {unit:?} in that zone; {order:?} is {t}"
        ))),
    }
}

/// What a date or timestamp column counts from the epoch, and its time
/// zone (`None` for other types and for no zone).
fn stored_unit(t: &DataType) -> (Option<CalendarUnit>, Option<&str>) {
    use arrow_schema::TimeUnit;
    match t {
        DataType::Date32 => (Some(CalendarUnit::Days), None),
        DataType::Date64 => (Some(CalendarUnit::Millis), None),
        DataType::Timestamp(u, tz) => (
            Some(match u {
                TimeUnit::Second => CalendarUnit::Seconds,
                TimeUnit::Millisecond => CalendarUnit::Millis,
                TimeUnit::Microsecond => CalendarUnit::Micros,
                TimeUnit::Nanosecond => CalendarUnit::Nanos,
            }),
            tz.as_deref(),
        ),
        _ => (None, None),
    }
}

/// An order column as Int64 (dates and timestamps by their stored
/// integer); nulls stay nulls, and a value i64 cannot hold (u64 above
/// i64::MAX) is an error.
pub fn order_as_i64(a: &ArrayRef, name: &str) -> Result<ArrayRef> {
    let c = arrow_cast::cast(a, &DataType::Int64)?;
    // The cast makes a null of a value it cannot hold.
    if c.null_count() > a.null_count() {
        return Err(DataError::Invalid(format!(
            "order column {name:?} has values above {} ({} in one chunk of this rank's rows)",
            i64::MAX,
            c.null_count() - a.null_count()
        )));
    }
    Ok(c)
}

/// The order column as i64 values (no nulls): the column's own buffer
/// where it is stored as i64 (Int64, Date64, timestamps), not a copy.
fn order_values(batch: &RecordBatch, col: usize, name: &str) -> Result<ScalarBuffer<i64>> {
    let a = batch.column(col);
    if a.null_count() > 0 {
        return Err(DataError::Invalid(format!(
            "order column {name:?} has null values ({} in this rank's rows)",
            a.null_count()
        )));
    }
    let a = order_as_i64(a, name)?;
    let a = a
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| DataError::Invalid("order column cast failed".into()))?;
    Ok(a.values().clone())
}

/// A value column as f64 values (the column's own buffer where it is
/// Float64, not a copy) and validity (None: no nulls).
fn value_columns(
    batch: &RecordBatch,
    col: usize,
) -> Result<(ScalarBuffer<f64>, Option<Vec<bool>>)> {
    value_columns_of(batch.column(col))
}

/// [`value_columns`] of one array.
fn value_columns_of(a: &ArrayRef) -> Result<(ScalarBuffer<f64>, Option<Vec<bool>>)> {
    let a = arrow_cast::cast(a, &DataType::Float64)?;
    let a = a
        .as_any()
        .downcast_ref::<Float64Array>()
        .ok_or_else(|| DataError::Invalid("value column cast failed".into()))?;
    let valid = a.nulls().map(|n| n.iter().collect());
    Ok((a.values().clone(), valid))
}

/// One input column of the kernel: the ghost rows (copies of lower ranks'
/// rows), then this rank's own rows where they lie (`main`: the sorted
/// batch's buffer). Rows are numbered across both, ghost rows first.
struct Joined<T, M> {
    ghost: Vec<T>,
    main: M,
}

impl<T: Copy, M: std::ops::Deref<Target = [T]>> Joined<T, M> {
    /// Row `i` (`i < len()`: the callers' chunk bounds).
    fn at(&self, i: usize) -> T {
        match i.checked_sub(self.ghost.len()) {
            None => self.ghost[i],
            Some(j) => self.main[j],
        }
    }

    /// Rows `[lo, hi)` as one slice: borrowed where they lie in one part;
    /// a chunk whose lookback reaches into the ghost rows (the first
    /// chunks only) gets a copy of its rows.
    fn rows(&self, lo: usize, hi: usize) -> std::borrow::Cow<'_, [T]> {
        let g = self.ghost.len();
        if hi <= g {
            std::borrow::Cow::Borrowed(&self.ghost[lo..hi])
        } else if lo >= g {
            std::borrow::Cow::Borrowed(&self.main[lo - g..hi - g])
        } else {
            let mut v = Vec::with_capacity(hi - lo);
            v.extend_from_slice(&self.ghost[lo..]);
            v.extend_from_slice(&self.main[..hi - g]);
            std::borrow::Cow::Owned(v)
        }
    }

    /// The first row of `[lo, hi)` for which `pred` is false (`pred` true
    /// on a prefix of it), or `hi`.
    fn partition_point_in(&self, lo: usize, hi: usize, pred: impl Fn(&T) -> bool) -> usize {
        let (mut lo, mut hi) = (lo, hi);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if pred(&self.at(mid)) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
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
    let stats = ctx.statistics().clone();
    let t = std::time::Instant::now();
    let mut input = input;
    let mut batches = Vec::new();
    while let Some(m) = input.recv().await {
        match m.payload {
            Payload::Table(t) => batches.push(t.into_batch()),
            _ => {
                return Err(NodeError::other("rolling got a non-table message"));
            }
        }
    }
    // (Reading the input is timed apart from the sort: the source may be
    // what the job waits for.)
    stats.record_op("rolling: input", t.elapsed());
    let t = std::time::Instant::now();
    let width = schema.fields().len();
    let (wide, batches, sort_keys) = with_group_forms(&schema, batches, &spec)?;
    let sorted = DistributedSort::new(sort_keys.clone())
        .sort(&ctx, wide, batches)
        .await?;
    stats.record_op("rolling: distributed sort", t.elapsed());
    let t = std::time::Instant::now();
    let prepared = prepare(&ctx, sorted, width, &sort_keys, &spec).await?;
    stats.record_op("rolling: lookback rounds", t.elapsed());
    // The kernel runs on a blocking thread, up to `rank_threads()` chunks
    // at once (see `emit`); chunks stream downstream as they are made, the
    // channel holding one group of them while the next is computed.
    let t = std::time::Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(rank_threads().max(2));
    let spec2 = spec.clone();
    let chunk_rows = output_chunk_rows(chunk_rows, &spec);
    let worker =
        tokio::task::spawn_blocking(move || emit(prepared, &spec2, out_schema, chunk_rows, &tx));
    let mut seq = 0;
    while let Some(b) = rx.recv().await {
        output.send(Message::new(seq, b?)).await?;
        seq += 1;
    }
    worker.await.map_err(NodeError::other)??;
    stats.record_op("rolling: aggregate and emit", t.elapsed());
    Ok(())
}

/// The most bytes of aggregate columns an output chunk holds: 16 MiB.
///
/// Output chunks wait in the channels between the kernel and the sink (a
/// dozen of them at once: the kernel's group of chunks, its channel, the
/// job's two channels, the sink's own), and their aggregate columns are
/// new memory (the input's columns are slices of the sorted partition). At
/// 65,536 rows, 21 value columns with all seven aggregations made 77 MB
/// chunks, and a 1M-row job held 2 GiB a rank for its output; a cap of
/// 16 MiB leaves narrow jobs' chunks as they were (5 aggregations of one
/// column: 40 bytes a row) and cuts wide ones to ~14K rows.
const OUTPUT_CHUNK_BYTES: usize = 16 << 20;

/// Rows per output chunk: `chunk_rows`, fewer where the aggregate columns
/// of that many rows would pass [`OUTPUT_CHUNK_BYTES`] (8 bytes a value,
/// and its validity; never below 1024 rows, where per-chunk costs grow).
fn output_chunk_rows(chunk_rows: usize, spec: &RollingSpec) -> usize {
    let row_bytes = (spec.values.len() * spec.aggs.len() * 9).max(1);
    chunk_rows
        .min((OUTPUT_CHUNK_BYTES / row_bytes).max(1024))
        .max(1)
}

/// A chunk's values of one column, and their validity (None: no nulls).
type ChunkValues<'a> = (Cow<'a, [f64]>, Option<Vec<bool>>);

/// One value column's kernel input: the ghost rows' values and validity
/// (copied from lower ranks, as f64), then this rank's rows as the sorted
/// batch stores them, converted to f64 a chunk at a time ([`rows`]): the
/// node holds no converted copy of the partition, whatever the column's
/// type (a Float64 column's values are read in place).
///
/// [`rows`]: ValueInput::rows
struct ValueInput {
    ghost: Vec<f64>,
    /// The ghost rows' validity, where one of them is null.
    ghost_valid: Option<Vec<bool>>,
    /// This rank's rows.
    main: ArrayRef,
    /// `main`'s values where it is Float64 (shared, not copied).
    main_f64: Option<ScalarBuffer<f64>>,
}

impl ValueInput {
    /// The input of a column of this rank's rows, after `ghost` rows.
    fn new(main: ArrayRef, ghost: Vec<f64>, ghost_valid: Option<Vec<bool>>) -> Self {
        let main_f64 = main
            .as_any()
            .downcast_ref::<Float64Array>()
            .map(|a| a.values().clone());
        ValueInput {
            ghost,
            ghost_valid,
            main,
            main_f64,
        }
    }

    /// Values and validity (None: no nulls) of rows `[lo, hi)`, ghost
    /// rows first: borrowed where they are Float64 rows of one part, else
    /// converted for this chunk.
    fn rows(&self, lo: usize, hi: usize) -> Result<ChunkValues<'_>> {
        let g = self.ghost.len();
        let (ms, me) = (lo.max(g) - g, hi.max(g) - g);
        let main = self.main.slice(ms, me - ms);
        let main_vals: Cow<'_, [f64]> = match &self.main_f64 {
            Some(v) => Cow::Borrowed(&v[ms..me]),
            None => Cow::Owned(value_columns_of(&main)?.0.to_vec()),
        };
        let main_valid = main
            .logical_nulls()
            .map(|n| n.iter().collect::<Vec<bool>>());
        if lo >= g {
            return Ok((main_vals, main_valid));
        }
        // The chunk reaches into the ghost rows (the first chunks only).
        let gs = &self.ghost[lo..g.min(hi)];
        let mut vals = Vec::with_capacity(hi - lo);
        vals.extend_from_slice(gs);
        vals.extend_from_slice(&main_vals);
        let valid = match (&self.ghost_valid, main_valid) {
            (None, None) => None,
            (gv, mv) => {
                let mut all = Vec::with_capacity(hi - lo);
                match gv {
                    Some(gv) => all.extend_from_slice(&gv[lo..g.min(hi)]),
                    None => all.resize(gs.len(), true),
                }
                match mv {
                    Some(mv) => all.extend(mv),
                    None => all.resize(hi - lo, true),
                }
                Some(all)
            }
        };
        Ok((Cow::Owned(vals), valid))
    }
}

/// A rank's sorted rows and the kernel's inputs.
struct Prepared {
    /// This rank's rows, sorted by (group,) order.
    sorted: RecordBatch,
    /// Order values of ghost rows, then of `sorted`.
    ts: Joined<i64, ScalarBuffer<i64>>,
    /// Per value column: values and validity of ghost rows, then `sorted`.
    vals: Vec<ValueInput>,
    /// Number of ghost rows.
    ghost: usize,
    /// Where each group starts in `sorted`, then its row count (the ghost
    /// rows belong to the first group; ungrouped `[0, rows]`).
    groups: Vec<usize>,
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

/// Smallest order value inside the window of any row at `t` or later
/// (`Window::reach`: a calendar window's start can move back at a clamped
/// month end). When `t - w` is below `i64::MIN` the window has no lower
/// cut (as in the kernel).
pub(crate) fn window_start(t: i64, spec: &RollingSpec) -> i64 {
    match spec.window.reach(t) {
        None => i64::MIN,
        Some(lo) => match spec.closed {
            Closed::Right | Closed::None => lo.saturating_add(1),
            Closed::Both | Closed::Left => lo,
        },
    }
}

/// The lookback plan of the job, from every rank's (rows, first ts, last
/// ts) as gathered (3 values per rank) and, grouped, its first and last
/// group keys: what each rank needs and passes right, and how many
/// HaloExchange rounds reach every need. The CPU and GPU paths both follow
/// it, so every rank runs the same rounds.
///
/// Grouped (the table sorted by (group, ts)), rank j needs the rows of
/// its first group g_j from `need(j)` on; lower ranks hold such rows only
/// where g_j is their last group, and every rank between such a rank and
/// j holds that group only. A rank passes right the rows of the group
/// that starts the next rank with rows (`pass_key`): no rank further
/// right can need another (its first group is at or above that one, and
/// every key this rank holds is at or below it).
pub(crate) struct HaloPlan<'a> {
    info: &'a [i64],
    /// Per rank: (first, last) group key in the row format; empty
    /// ungrouped (the whole table one group).
    keys: Vec<(Vec<u8>, Vec<u8>)>,
    n: usize,
    spec: &'a RollingSpec,
    /// HaloExchange rounds every rank runs.
    pub(crate) rounds: usize,
}

impl<'a> HaloPlan<'a> {
    /// The plan for `n` ranks; `info` must hold 3 values per rank and
    /// `keys` a (first, last) group key pair per rank, or none ungrouped (a
    /// peer that gathered something else is an error, not a panic or a
    /// plan that differs between ranks).
    pub(crate) fn with_groups(
        info: &'a [i64],
        keys: Vec<(Vec<u8>, Vec<u8>)>,
        n: usize,
        spec: &'a RollingSpec,
    ) -> Result<Self> {
        if info.len() != 3 * n || !(keys.is_empty() || keys.len() == n) {
            return Err(DataError::Invalid(format!(
                "the ranks' (rows, first, last) order values came as {} values and {} key pairs for {n} ranks, not {}",
                info.len(),
                keys.len(),
                3 * n
            )));
        }
        let mut p = HaloPlan {
            info,
            keys,
            n,
            spec,
            rounds: 0,
        };
        // Rank j's need reaches back to the first lower rank holding it.
        p.rounds = (0..n)
            .filter(|j| p.rows(*j) > 0)
            .filter_map(|j| {
                (0..j)
                    .find(|k| {
                        p.rows(*k) > 0 && p.info[3 * k + 2] >= p.need(j) && p.continues(*k, j)
                    })
                    .map(|k| j - k)
            })
            .max()
            .unwrap_or(0);
        Ok(p)
    }

    /// Whether rank k's last group is rank j's first (always ungrouped).
    fn continues(&self, k: usize, j: usize) -> bool {
        self.keys.is_empty() || self.keys[k].1 == self.keys[j].0
    }

    /// Rows of rank r.
    pub(crate) fn rows(&self, r: usize) -> i64 {
        self.info[3 * r]
    }

    /// Smallest ts rank r's first window needs (inclusive).
    pub(crate) fn need(&self, r: usize) -> i64 {
        window_start(self.info[3 * r + 1], self.spec)
    }

    /// The first rank right of r with rows.
    fn next_with_rows(&self, r: usize) -> Option<usize> {
        (r + 1..self.n).find(|j| self.rows(*j) > 0)
    }

    /// Grouped: rank r's first group key (None ungrouped).
    pub(crate) fn own_key(&self, r: usize) -> Option<&[u8]> {
        self.keys.get(r).map(|k| k.0.as_slice())
    }

    /// Grouped: the group whose rows rank r passes right (None ungrouped,
    /// or where no rank right of r has rows).
    pub(crate) fn pass_key(&self, r: usize) -> Option<&[u8]> {
        self.next_with_rows(r).and_then(|j| self.own_key(j))
    }

    /// What rank r must pass right: rows from this ts on (of the group
    /// [`Self::pass_key`] grouped) that some rank further right needs.
    pub(crate) fn pass_from(&self, r: usize) -> Option<i64> {
        let first = self.next_with_rows(r)?;
        (first..self.n)
            .filter(|j| self.rows(*j) > 0 && self.continues_group(first, *j))
            .map(|j| self.need(j))
            .min()
    }

    /// Whether ranks i and j start with the same group (always ungrouped).
    fn continues_group(&self, i: usize, j: usize) -> bool {
        self.keys.is_empty() || self.keys[i].0 == self.keys[j].0
    }
}

/// Rows below which a group of chunks is computed on one thread.
const PARALLEL_MIN_ROWS: usize = 1 << 14;

/// Runs the kernel chunk by chunk and sends the output chunks.
///
/// A chunk of output rows `[s, e)` (never splitting a run of equal ts in
/// one group) is computed over the rows from the first one the earliest
/// window of its first group needs (ghost rows included), with the group
/// starts inside it as the kernel's segments; a chunk is made at least
/// twice as long as that lookback, so the total work stays O(n) even when
/// windows span most of a group. Up to [`rank_threads`] chunks are
/// computed at once on scoped threads, then sent in order.
fn emit(
    p: Prepared,
    spec: &RollingSpec,
    out_schema: SchemaRef,
    chunk_rows: usize,
    tx: &tokio::sync::mpsc::Sender<Result<RecordBatch>>,
) -> Result<()> {
    let n = p.sorted.num_rows();
    let run = |lo: usize, hi: usize, segments: Segments<'_>| -> Result<Vec<ArrayRef>> {
        let mut cols = Vec::new();
        let ts = p.ts.rows(lo, hi);
        for v in &p.vals {
            let (vals, valid) = v.rows(lo, hi)?;
            let r = rolling_segments(
                &ts,
                &vals,
                valid.as_deref(),
                segments,
                spec.window,
                spec.closed,
                &spec.aggs,
            )
            .map_err(|e| DataError::Invalid(e.to_string()))?;
            for c in r.columns {
                cols.push(agg_array(c.agg, c.values, c.valid));
            }
        }
        Ok(cols)
    };
    // A chunk: output rows [s, e), computed over rows [lo, hi) (indices
    // among the ghost rows then own ones) whose first `emit_from` only feed
    // windows, with the groups starting at `offsets` (from lo).
    struct Chunk {
        s: usize,
        e: usize,
        lo: usize,
        hi: usize,
        emit_from: usize,
        offsets: Vec<usize>,
    }
    let g0 = p.ghost;
    let groups = &p.groups;
    let next = |s: usize| -> Chunk {
        // Row s's group, and where it starts (its ghost rows first).
        let gi = groups.partition_point(|o| *o <= s).saturating_sub(1);
        let start = if gi == 0 { 0 } else { g0 + groups[gi] };
        let from = window_start(p.ts.at(g0 + s), spec);
        let lo = p.ts.partition_point_in(start, g0 + s, |x| *x < from);
        let lookback = g0 + s - lo;
        let mut e = (s + chunk_rows.max(2 * lookback)).min(n);
        while e < n && p.ts.at(g0 + e) == p.ts.at(g0 + e - 1) && groups.binary_search(&e).is_err() {
            e += 1;
        }
        // The groups that start inside (s, e).
        let (a, b) = (
            groups.partition_point(|o| *o <= s),
            groups.partition_point(|o| *o < e),
        );
        let mut offsets = Vec::with_capacity(b.saturating_sub(a) + 2);
        offsets.push(0);
        offsets.extend(groups[a..b.max(a)].iter().map(|o| g0 + o - lo));
        offsets.push(g0 + e - lo);
        Chunk {
            s,
            e,
            lo,
            hi: g0 + e,
            emit_from: lookback,
            offsets,
        }
    };
    // Chunks are independent: up to `rank_threads()` of them are computed
    // at once, then sent in order (so at most that many wait in memory).
    let threads = rank_threads();
    let mut s = 0usize;
    while s < n {
        let mut batch = Vec::with_capacity(threads);
        while batch.len() < threads && s < n {
            let c = next(s);
            s = c.e;
            batch.push(c);
        }
        // Small chunks (a small `chunk_rows`) cost less than the threads.
        let rows: usize = batch.iter().map(|c| c.hi - c.lo).sum();
        let use_threads = if rows >= PARALLEL_MIN_ROWS {
            threads
        } else {
            1
        };
        let outs = map_scoped(batch, use_threads, |c| -> Result<RecordBatch> {
            let segments = Segments {
                offsets: &c.offsets,
                emit_from: c.emit_from,
            };
            let cols = run(c.lo, c.hi, segments)?;
            with_aggs(&p.sorted.slice(c.s, c.e - c.s), out_schema.clone(), cols)
        });
        for b in outs {
            if tx.blocking_send(Ok(b?)).is_err() {
                // The node stopped listening (cancelled): stop quietly.
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Name of the grouping form of the `i`th group column, where it is a
/// float column, while the job sorts (dropped before output; no input
/// column can be named so, as the name starts with a NUL).
fn canonical_key(i: usize) -> String {
    format!("\0braid_group{i}")
}

/// The job's sort: each group column (its grouping form where it is a
/// float column, `canonical_group_key`: 0.0 and -0.0 one group, every NaN
/// one group, appended after the input's columns as [`canonical_key`])
/// then the order column. Returns the batches' schema with those columns,
/// the batches, and the sort keys (the group keys first, the order last).
fn with_group_forms(
    schema: &SchemaRef,
    batches: Vec<RecordBatch>,
    spec: &RollingSpec,
) -> Result<(SchemaRef, Vec<RecordBatch>, Vec<SortKey>)> {
    let keys: Vec<usize> = spec
        .by
        .iter()
        .map(|b| column_index(schema, b))
        .collect::<Result<_>>()?;
    let floats: Vec<usize> = (0..keys.len())
        .filter(|&i| is_float_key(schema.field(keys[i]).data_type()))
        .collect();
    let mut sort_keys: Vec<SortKey> = spec.by.iter().map(SortKey::asc).collect();
    for &i in &floats {
        sort_keys[i] = SortKey::asc(canonical_key(i));
    }
    sort_keys.push(SortKey::asc(&spec.order));
    if floats.is_empty() {
        return Ok((schema.clone(), batches, sort_keys));
    }
    let mut fields = schema.fields().to_vec();
    for &i in &floats {
        fields.push(Arc::new(Field::new(
            canonical_key(i),
            group_key_type(schema.field(keys[i]).data_type()),
            true,
        )));
    }
    let wide = Arc::new(Schema::new(fields));
    let mut parts = Vec::with_capacity(batches.len());
    for b in batches {
        let mut cols = b.columns().to_vec();
        for &i in &floats {
            let c = b.column(keys[i]);
            cols.push(canonical_group_key(c)?.unwrap_or_else(|| c.clone()));
        }
        parts.push(RecordBatch::try_new(wide.clone(), cols)?);
    }
    Ok((wide, parts, sort_keys))
}

/// A rank's first and last group keys in the row format (empty
/// ungrouped), and its (rows, first ts, last ts), as one AllGather part:
/// `rows, first, last` (i64 LE), the first key's length (u32 LE), the
/// first key, the last key.
fn encode_edges(info: [i64; 3], first: &[u8], last: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(28 + first.len() + last.len());
    for v in info {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(first.len() as u32).to_le_bytes());
    out.extend_from_slice(first);
    out.extend_from_slice(last);
    out
}

/// Rank `r`'s part from [`encode_edges`], appended to `info` and `keys`; a
/// malformed part is an error naming the rank (a peer of another build).
fn decode_edges(
    r: usize,
    part: &[u8],
    info: &mut Vec<i64>,
    keys: &mut Vec<(Vec<u8>, Vec<u8>)>,
) -> Result<()> {
    let bad = || {
        DataError::Invalid(format!(
            "rank {r} sent a malformed (rows, first, last) part"
        ))
    };
    let word = |at: usize| -> Result<[u8; 8]> {
        part.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(bad)
    };
    for k in 0..3 {
        info.push(i64::from_le_bytes(word(8 * k)?));
    }
    let len: [u8; 4] = part
        .get(24..28)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(bad)?;
    let len = u32::from_le_bytes(len) as usize;
    let first = part.get(28..28 + len).ok_or_else(bad)?;
    let last = part.get(28 + len..).ok_or_else(bad)?;
    keys.push((first.to_vec(), last.to_vec()));
    Ok(())
}

/// Rank-local row lookups of the group keys in the row format (`None`
/// ungrouped): ranks compare their first and last groups, and find where
/// a group's rows start in a sorted batch, by these bytes.
struct GroupKeys {
    conv: arrow_row::RowConverter,
    /// The group key columns of the batches searched, with their order.
    cols: Vec<(usize, arrow_schema::SortOptions)>,
}

impl GroupKeys {
    /// The key of row `i` of `b`.
    fn at(&self, b: &RecordBatch, i: usize) -> Result<Vec<u8>> {
        let rows = key_rows(&self.conv, &b.slice(i, 1), &self.cols)?;
        Ok(rows.row(0).as_ref().to_vec())
    }
}

/// The rows of `b` (sorted by group keys, then its order column 0, whose
/// values are `ts`) from the first one at or after (`key`, `from`): a
/// suffix. Every row of `b` has a group key at or below `key` (rows of
/// lower ranks, or this rank's rows where `key` is a group of a higher
/// rank), so the suffix holds rows of group `key` only. `from` None: no
/// rows.
fn suffix_from(
    b: &RecordBatch,
    ts: &[i64],
    groups: Option<(&GroupKeys, &[u8])>,
    from: Option<i64>,
) -> Result<RecordBatch> {
    let Some(x) = from else {
        return Ok(b.slice(0, 0));
    };
    let start = match groups {
        None => ts.partition_point(|v| *v < x),
        Some((gk, key)) => {
            // The first row not below (key, x), by bisection: one key
            // converted per step.
            let (mut lo, mut hi) = (0, b.num_rows());
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                let below = gk
                    .at(b, mid)?
                    .as_slice()
                    .cmp(key)
                    .then(ts[mid].cmp(&x))
                    .is_lt();
                if below {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            lo
        }
    };
    Ok(b.slice(start, b.num_rows() - start))
}

/// After the job's sort ([`with_group_forms`], [`DistributedSort`]):
/// `sorted` is this rank's run of the table sorted by (group columns,
/// order), the input's `width` columns and the grouping forms after them.
/// Fetches the lookback rows this rank's first group needs from lower
/// ranks (HaloExchange rounds, as many as the farthest need takes) and
/// finds its groups.
///
/// Ungrouped the whole table is one group. Grouped, only rank r's first
/// group can have rows on lower ranks (its key is at or above every key
/// below), and only ranks whose last group it is hold them; a lower rank
/// passes right the rows of the group that starts the next rank with rows
/// (the lowest key above it), from the earliest ts that group's ranks
/// need.
async fn prepare(
    ctx: &Context,
    sorted: RecordBatch,
    width: usize,
    sort_keys: &[SortKey],
    spec: &RollingSpec,
) -> Result<Prepared> {
    let (me, n) = (ctx.rank() as usize, ctx.nranks() as usize);
    let schema = sorted.schema();
    let oi = column_index(&schema, &spec.order)?;
    let ts = order_values(&sorted, oi, &spec.order)?;
    let group_cols: Vec<usize> = sort_keys[..sort_keys.len().saturating_sub(1)]
        .iter()
        .map(|k| column_index(&schema, &k.column))
        .collect::<Result<_>>()?;
    // Halo batches: the order column, the values, the group keys.
    let mut keep_cols = vec![oi];
    for v in &spec.values {
        keep_cols.push(column_index(&schema, v)?);
    }
    let key_at = keep_cols.len();
    keep_cols.extend(&group_cols);
    let narrow = sorted.project(&keep_cols)?;
    let narrow_schema = narrow.schema();
    let gk = if group_cols.is_empty() {
        None
    } else {
        // In the sort's order (nulls last: not Arrow's default).
        let cols: Vec<(usize, arrow_schema::SortOptions)> = sort_keys
            .iter()
            .zip(key_at..keep_cols.len())
            .map(|(k, i)| {
                let o = arrow_schema::SortOptions {
                    descending: k.descending,
                    nulls_first: k.nulls_first,
                };
                (i, o)
            })
            .collect();
        Some(GroupKeys {
            conv: converter(&narrow_schema, &cols)?,
            cols,
        })
    };
    // 2. Everyone's (rows, first ts, last ts) and first and last groups.
    let (first_key, last_key) = match (&gk, narrow.num_rows()) {
        (Some(g), rows) if rows > 0 => (g.at(&narrow, 0)?, g.at(&narrow, rows - 1)?),
        _ => (Vec::new(), Vec::new()),
    };
    let mine = encode_edges(
        [
            ts.len() as i64,
            ts.first().copied().unwrap_or(0),
            ts.last().copied().unwrap_or(0),
        ],
        &first_key,
        &last_key,
    );
    let parts = allgather_parts::<u8>(ctx, mine).await?;
    let (mut info, mut keys) = (Vec::with_capacity(3 * n), Vec::with_capacity(n));
    for (r, part) in parts.iter().enumerate() {
        decode_edges(r, &part.as_slice(), &mut info, &mut keys)?;
    }
    if gk.is_none() {
        keys.clear();
    }
    let plan = HaloPlan::with_groups(&info, keys, n, spec)?;
    // 3. Halo rounds.
    fn group<'k>(
        gk: &'k Option<GroupKeys>,
        key: Option<&'k [u8]>,
    ) -> Option<(&'k GroupKeys, &'k [u8])> {
        gk.as_ref().zip(key)
    }
    let mut to_pass = suffix_from(
        &narrow,
        &ts,
        group(&gk, plan.pass_key(me)),
        plan.pass_from(me),
    )?;
    let mut ghosts: Vec<RecordBatch> = Vec::new(); // newest round first after reversal
    for _ in 0..plan.rounds {
        let empty = PackedData {
            metadata: bytes::Bytes::new(),
            data: braid_core::Buffer::default(),
        };
        let out = pack(&to_pass)?;
        let halo = HaloExchange::new(ctx).exchange(empty, out).await?;
        let got = match halo.from_left {
            Some(p) if !p.data.is_empty() => {
                concat_batches(&narrow_schema, &unpack(&p, &narrow_schema)?)?
            }
            _ => narrow.slice(0, 0),
        };
        let got_ts = order_values(&got, 0, &spec.order)?;
        if plan.rows(me) > 0 {
            let need = Some(plan.need(me));
            ghosts.push(suffix_from(
                &got,
                &got_ts,
                group(&gk, plan.own_key(me)),
                need,
            )?);
        }
        to_pass = suffix_from(
            &got,
            &got_ts,
            group(&gk, plan.pass_key(me)),
            plan.pass_from(me),
        )?;
    }
    // Later rounds hold older rows: put them first.
    ghosts.reverse();
    let ghost = ghosts.iter().map(|b| b.num_rows()).sum::<usize>();
    // This rank's groups: where each starts among its rows, then the end.
    let mut groups = vec![0];
    if !group_cols.is_empty() && sorted.num_rows() > 0 {
        // (A pass over the partition: on a blocking thread.)
        let cols: Vec<ArrayRef> = group_cols
            .iter()
            .map(|&i| sorted.column(i).clone())
            .collect();
        let ends = tokio::task::spawn_blocking(move || -> Result<Vec<usize>> {
            let p = arrow_ord::partition::partition(&cols)?;
            Ok(p.ranges().iter().map(|r| r.end).collect())
        })
        .await
        .map_err(|e| DataError::Invalid(e.to_string()))??;
        groups.extend(ends);
    } else {
        groups.push(sorted.num_rows());
    }
    // The kernel's inputs: ghost rows copied, then this rank's rows where
    // they lie (the sorted batch's buffers: `ts` is its order column).
    let mut ghost_ts = Vec::with_capacity(ghost);
    for b in &ghosts {
        ghost_ts.extend_from_slice(&order_values(b, 0, &spec.order)?);
    }
    let ts = Joined {
        ghost: ghost_ts,
        main: ts,
    };
    let mut vals = Vec::new();
    for k in 0..spec.values.len() {
        let mut values = Vec::with_capacity(ghost);
        let mut ghost_ok: Option<Vec<bool>> = None;
        for b in &ghosts {
            let (v, ok) = value_columns(b, k + 1)?;
            match (ok, &mut ghost_ok) {
                (Some(ok), Some(all)) => all.extend(ok),
                (Some(ok), None) => {
                    let mut all = vec![true; values.len()];
                    all.extend(ok);
                    ghost_ok = Some(all);
                }
                (None, Some(all)) => all.extend(std::iter::repeat_n(true, v.len())),
                (None, None) => {}
            }
            values.extend_from_slice(&v);
        }
        vals.push(ValueInput::new(
            narrow.column(k + 1).clone(),
            values,
            ghost_ok,
        ));
    }
    // The grouping forms go; the input's columns stay.
    let keep: Vec<usize> = (0..width).collect();
    Ok(Prepared {
        sorted: sorted.project(&keep)?,
        ts,
        vals,
        ghost,
        groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(window: i64, closed: Closed) -> RollingSpec {
        RollingSpec {
            order: "ts".into(),
            by: Vec::new(),
            values: vec!["v".into()],
            window: window.into(),
            closed,
            aggs: vec![Agg::Count],
        }
    }

    #[test]
    fn decimal_and_dictionary_values_read_as_f64() {
        use arrow_array::{Decimal32Array, Decimal64Array, Decimal128Array};
        let cols: Vec<(DataType, ArrayRef)> = vec![
            (
                DataType::Decimal32(9, 2),
                Arc::new(
                    Decimal32Array::from(vec![Some(125), None, Some(-7)])
                        .with_precision_and_scale(9, 2)
                        .unwrap(),
                ),
            ),
            (
                DataType::Decimal64(18, 2),
                Arc::new(
                    Decimal64Array::from(vec![Some(125), None, Some(-7)])
                        .with_precision_and_scale(18, 2)
                        .unwrap(),
                ),
            ),
            (
                DataType::Decimal128(38, 2),
                Arc::new(
                    Decimal128Array::from(vec![Some(125), None, Some(-7)])
                        .with_precision_and_scale(38, 2)
                        .unwrap(),
                ),
            ),
            // Dictionary-encoded (was refused: "expected a numeric type").
            (
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Float64)),
                Arc::new(
                    arrow_array::DictionaryArray::<arrow_array::types::Int32Type>::try_new(
                        arrow_array::Int32Array::from(vec![Some(1), None, Some(0)]),
                        Arc::new(Float64Array::from(vec![-0.07, 1.25])),
                    )
                    .unwrap(),
                ),
            ),
        ];
        for (dt, a) in cols {
            let schema = Schema::new(vec![
                Field::new("ts", DataType::Int64, false),
                Field::new("v", dt.clone(), true),
            ]);
            spec(5, Closed::Right).output_schema(&schema).unwrap();
            let ts: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
            let b = RecordBatch::try_new(Arc::new(schema), vec![ts, a]).unwrap();
            let (v, valid) = value_columns(&b, 1).unwrap();
            assert_eq!((v[0], v[2]), (1.25, -0.07), "{dt}");
            assert_eq!(valid, Some(vec![true, false, true]), "{dt}");
        }
    }

    /// Output chunks hold at most 16 MiB of aggregates (9 bytes a value
    /// with its validity), never fewer than 1024 rows.
    #[test]
    fn output_chunks_are_cut_by_their_aggregates_bytes() {
        let with = |values: usize, aggs: &[Agg]| RollingSpec {
            values: (0..values).map(|i| format!("v{i}")).collect(),
            aggs: aggs.to_vec(),
            ..spec(5, Closed::Right)
        };
        let five = [Agg::Sum, Agg::Mean, Agg::Min, Agg::Max, Agg::Count];
        let all = [five.as_slice(), &[Agg::Std, Agg::Var]].concat();
        assert_eq!(output_chunk_rows(65_536, &with(1, &five)), 65_536);
        assert_eq!(output_chunk_rows(1, &with(1, &five)), 1);
        assert_eq!(
            output_chunk_rows(65_536, &with(21, &all)),
            (16 << 20) / (21 * 7 * 9)
        );
        assert_eq!(output_chunk_rows(65_536, &with(5000, &all)), 1024);
    }

    #[test]
    fn window_start_has_no_lower_cut_below_i64_min() {
        // t - w below i64::MIN: every row up to t is inside (as the kernel says).
        for c in [Closed::Right, Closed::Both, Closed::Left, Closed::None] {
            assert_eq!(window_start(i64::MIN + 1, &spec(2, c)), i64::MIN, "{c:?}");
        }
        // t - w exactly i64::MIN: right/none exclude it, both/left keep it.
        assert_eq!(
            window_start(i64::MIN + 2, &spec(2, Closed::Right)),
            i64::MIN + 1
        );
        assert_eq!(window_start(i64::MIN + 2, &spec(2, Closed::Both)), i64::MIN);
        assert_eq!(window_start(10, &spec(3, Closed::None)), 8);
        assert_eq!(window_start(10, &spec(3, Closed::Left)), 7);
    }

    #[test]
    fn calendar_windows_need_a_date_or_utc_timestamp_of_their_unit() {
        use arrow_schema::TimeUnit;
        let cal = |unit| RollingSpec {
            window: Window::Calendar {
                months: 1,
                then: 0,
                unit,
            },
            ..spec(0, Closed::Right)
        };
        let with = |t: DataType| {
            Schema::new(vec![
                Field::new("ts", t, false),
                Field::new("v", DataType::Float64, true),
            ])
        };
        let us = |tz: Option<&str>| DataType::Timestamp(TimeUnit::Microsecond, tz.map(Into::into));
        for (t, unit) in [
            (us(None), CalendarUnit::Micros),
            (us(Some("UTC")), CalendarUnit::Micros),
            (us(Some("Etc/GMT")), CalendarUnit::Micros),
            (us(Some("+00:00")), CalendarUnit::Micros),
            (DataType::Date32, CalendarUnit::Days),
            (DataType::Date64, CalendarUnit::Millis),
        ] {
            cal(unit)
                .output_schema(&with(t.clone()))
                .unwrap_or_else(|e| panic!("{t}: {e}"));
        }
        for (t, unit, want) in [
            (
                DataType::Int64,
                CalendarUnit::Micros,
                "needs a date or timestamp",
            ),
            (us(None), CalendarUnit::Millis, "counting Millis"),
            (DataType::Date32, CalendarUnit::Micros, "counting Micros"),
            (
                us(Some("Europe/Paris")),
                CalendarUnit::Micros,
                "Window::Zoned",
            ),
        ] {
            let e = cal(unit)
                .output_schema(&with(t.clone()))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{t}: {e}");
        }
    }
}
