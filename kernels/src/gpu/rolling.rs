//! Rolling time-window aggregations on the device, with the semantics of
//! the CPU kernel ([`crate::rolling`]): same windows for every [`Closed`]
//! mode, nulls skipped, sample std/var, null for an empty window (count 0).
//!
//! ```text
//!   levels:  level 1 = aggregates of 32 rows, level L = of 32 level L-1
//!            entries (n/32 + n/1024 + ... entries, 56 bytes each)
//!   query:   one thread per output row: gallop to the window [lo, hi),
//!            then merge at most 2 * 31 entries per level
//! ```
//!
//! Cost: O(log w) to find a window and O(32 log_32 w) merges per row, so a
//! window that spans most of the data costs no more than a few hundred
//! merges per row; the partial aggregates are only merged (compensated
//! sum, shifted moments), never subtracted. Rows sorted by (key, ts) with a
//! key column make every group its own series: a window never crosses a
//! key boundary.

use std::sync::Arc;

use braid_core::cuda::cudarc::driver::PushKernelArg;
use braid_core::cuda::{DeviceBuffer, Gpu};

use super::launch::{KernelError, Kernels, grid, launched};
use super::ops::{mark_written, wait_inputs};
use crate::rolling::{Agg, Closed};

/// Entries merged into one of the next level.
const FAN: usize = 32;
/// Bytes of one level entry (`RollAgg` in `kernels.cu`: 7 f64).
const ENTRY: usize = 56;
/// Levels the query kernel can hold, level 0 (rows) included.
const MAX_LEVELS: usize = 8;

/// The rows of one rolling computation, all on one device.
#[derive(Debug, Clone, Copy)]
pub struct RollingInput<'a> {
    /// Order values (i64), ascending within each key.
    pub ts: &'a DeviceBuffer,
    /// Group keys (i64), ascending; `None`: one group.
    pub key: Option<&'a DeviceBuffer>,
    /// Values (f64).
    pub values: &'a DeviceBuffer,
    /// Validity (one byte per row, 0 = null); `None`: no nulls.
    pub valid: Option<&'a DeviceBuffer>,
    /// Rows `0..emit_from` are lookback rows: in windows, not in the output.
    pub emit_from: usize,
}

/// One output column of [`rolling`].
#[derive(Debug)]
pub struct GpuAggColumn {
    /// Which aggregation.
    pub agg: Agg,
    /// f64 per output row (i64 for [`Agg::Count`]); 0 where null.
    pub values: DeviceBuffer,
    /// One byte per output row (0 = null); `None` for count (never null).
    pub valid: Option<DeviceBuffer>,
}

fn slot(a: Agg) -> usize {
    match a {
        Agg::Sum => 0,
        Agg::Mean => 1,
        Agg::Min => 2,
        Agg::Max => 3,
        Agg::Count => 4,
        Agg::Std => 5,
        Agg::Var => 6,
    }
}

fn code(c: Closed) -> u32 {
    match c {
        Closed::Right => 0,
        Closed::Both => 1,
        Closed::Left => 2,
        Closed::None => 3,
    }
}

/// Rolling aggregations of `input` over windows of length `window`; one
/// column per entry of `aggs` (a repeated aggregation is computed once and
/// copied). The caller guarantees the sort order (the kernel does not
/// check it; the job sorts on the device right before).
pub fn rolling(
    gpu: &Arc<Gpu>,
    input: RollingInput<'_>,
    window: i64,
    closed: Closed,
    aggs: &[Agg],
) -> Result<Vec<GpuAggColumn>, KernelError> {
    let rank = gpu.rank();
    let bad = |detail: String| KernelError::Invalid {
        rank,
        kernel: "rolling",
        detail,
    };
    let n = input.ts.len() / 8;
    if input.ts.len() % 8 != 0 || input.values.len() != n * 8 {
        return Err(bad(format!(
            "{} order bytes and {} value bytes (8 bytes per row each)",
            input.ts.len(),
            input.values.len()
        )));
    }
    if input.key.is_some_and(|k| k.len() != n * 8) || input.valid.is_some_and(|v| v.len() != n) {
        return Err(bad(format!(
            "key or validity length differs from the {n} rows"
        )));
    }
    if window < 0 {
        return Err(bad(format!("window must be >= 0, got {window}")));
    }
    if input.emit_from > n {
        return Err(bad(format!(
            "first output row {} is past the {n} rows",
            input.emit_from
        )));
    }
    let rows = n - input.emit_from;
    // Outputs, one per distinct aggregation.
    let mut outs: Vec<Option<(DeviceBuffer, Option<DeviceBuffer>)>> =
        (0..7).map(|_| None).collect();
    for &a in aggs {
        let s = slot(a);
        if outs[s].is_none() {
            let v = DeviceBuffer::alloc(gpu, rows * 8)?;
            let ok = if a == Agg::Count {
                None
            } else {
                Some(DeviceBuffer::alloc(gpu, rows)?)
            };
            outs[s] = Some((v, ok));
        }
    }
    if rows > 0 {
        let k = Kernels::get(gpu)?;
        // Levels 1.. (level 0 is the rows).
        let mut levels: Vec<DeviceBuffer> = Vec::new();
        let mut size = FAN;
        while n / size >= 1 && levels.len() + 1 < MAX_LEVELS {
            let m = n / size;
            let mut out = DeviceBuffer::alloc(gpu, m * ENTRY)?;
            let m64 = m as u64;
            let op = out.ptr();
            match levels.last() {
                None => {
                    let f = k.func(rank, "roll_level_rows")?;
                    let mut ins = vec![input.values, &out];
                    ins.extend(input.valid);
                    wait_inputs(gpu, &ins)?;
                    let (vp, okp) = (input.values.ptr(), input.valid.map_or(0, |v| v.ptr()));
                    let mut b = gpu.stream().launch_builder(f);
                    b.arg(&vp).arg(&okp).arg(&op).arg(&m64);
                    // SAFETY: `m * 32 <= n` rows in, `m` entries out.
                    launched(rank, unsafe { b.launch(grid(m)) })?;
                }
                Some(prev) => {
                    let f = k.func(rank, "roll_level_up")?;
                    wait_inputs(gpu, &[prev, &out])?;
                    let pp = prev.ptr();
                    let mut b = gpu.stream().launch_builder(f);
                    b.arg(&pp).arg(&op).arg(&m64);
                    // SAFETY: `m * 32` entries of the previous level in.
                    launched(rank, unsafe { b.launch(grid(m)) })?;
                }
            }
            mark_written(gpu, &[], &mut [&mut out])?;
            levels.push(out);
            size *= FAN;
        }
        let mut ptrs = [0u64; 22];
        for (l, b) in levels.iter().enumerate() {
            ptrs[l + 1] = b.ptr();
        }
        for (s, o) in outs.iter().enumerate() {
            if let Some((v, ok)) = o {
                ptrs[8 + s] = v.ptr();
                ptrs[15 + s] = ok.as_ref().map_or(0, |b| b.ptr());
            }
        }
        let d_ptrs = DeviceBuffer::from_slice(gpu, &ptrs)?;
        let mut ins: Vec<&DeviceBuffer> = vec![input.ts, input.values, &d_ptrs];
        ins.extend(input.key);
        ins.extend(input.valid);
        ins.extend(levels.iter());
        for (v, ok) in outs.iter().flatten() {
            ins.push(v);
            ins.extend(ok.as_ref());
        }
        wait_inputs(gpu, &ins)?;
        let f = k.func(rank, "rolling_window")?;
        let (tp, kp, vp, okp) = (
            input.ts.ptr(),
            input.key.map_or(0, |b| b.ptr()),
            input.values.ptr(),
            input.valid.map_or(0, |b| b.ptr()),
        );
        let (n64, e64, cl, pp, nl) = (
            n as u64,
            input.emit_from as u64,
            code(closed),
            d_ptrs.ptr(),
            levels.len() as u32 + 1,
        );
        let mut b = gpu.stream().launch_builder(f);
        b.arg(&tp)
            .arg(&kp)
            .arg(&vp)
            .arg(&okp)
            .arg(&n64)
            .arg(&e64)
            .arg(&window)
            .arg(&cl)
            .arg(&pp)
            .arg(&nl);
        // SAFETY: every pointer in `ptrs` is a live buffer of the sizes
        // allocated above; row inputs have `n` rows (checked).
        launched(rank, unsafe { b.launch(grid(rows)) })?;
        let ev = gpu.record(gpu.stream())?;
        for b in [input.ts, input.values, &d_ptrs]
            .into_iter()
            .chain(input.key)
            .chain(input.valid)
            .chain(levels.iter())
        {
            b.note_use(ev.clone());
        }
        for (v, ok) in outs.iter_mut().flatten() {
            v.set_ready(ev.clone());
            if let Some(ok) = ok {
                ok.set_ready(ev.clone());
            }
        }
    }
    // One column per requested aggregation, in the order asked.
    let mut cols: Vec<GpuAggColumn> = Vec::with_capacity(aggs.len());
    for &a in aggs {
        let col = match cols.iter().find(|c| slot(c.agg) == slot(a)) {
            Some(first) => GpuAggColumn {
                agg: a,
                values: first.values.try_clone()?,
                valid: first.valid.as_ref().map(|b| b.try_clone()).transpose()?,
            },
            None => {
                let Some((values, valid)) = outs[slot(a)].take() else {
                    return Err(bad("internal: missing output".into()));
                };
                GpuAggColumn {
                    agg: a,
                    values,
                    valid,
                }
            }
        };
        cols.push(col);
    }
    Ok(cols)
}
