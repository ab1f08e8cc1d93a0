//! Rolling time-window aggregations on the device, with the semantics of
//! the CPU kernel ([`crate::rolling`]): same windows for every [`Closed`]
//! mode, nulls skipped, sample std/var, null for an empty window (count 0).
//!
//! Tile passes, then a general one (see `kernels.cu`):
//!
//! ```text
//!   plain:    one block per 1024 output rows; the rows and the lookback
//!             its windows need (up to 448 rows) in shared memory; window
//!             bounds by lookups in a bucket index of the region's order
//!             values (with a key column, or a gap too wide for the index:
//!             galloping and monotone pointers, 4 consecutive rows per
//!             thread); count, sum and sum of squares (about a value near
//!             the tile's mean) as differences of plain prefix sums over
//!             the region (one block scan for both), each result checked
//!             against a bound of its rounding error and kept when within
//!             2^-36 of itself; a window of up to 32 rows that fails is
//!             summed from its rows; min/max from a sparse table over pairs
//!             of rows built in place, every second power of two, each row
//!             reading its first and last rows and its level as it is
//!             built. Outputs row-parallel and coalesced: one read of the
//!             inputs, one write of the outputs.
//!   double-double: the same pass with double-double prefix sums (exact
//!             to ~2^-100 of the region's magnitude), over the tiles the
//!             plain pass left (a longer window past its bound, or any
//!             reason below)
//!   long:     the double-double pass compiled with a larger region
//!             (lookback up to 1344 rows) on 2048-row tiles
//!             (`Build::LongWindows`), only over the tiles still left;
//!             6-7x faster than the general pass on windows of 700-1200
//!             rows (H200)
//!   general:  only for tiles the tile passes leave (a window longer than
//!             the larger region, a long run of one ts, a NaN, an
//!             infinity, magnitudes 2^40 apart): level 1 = aggregates of
//!             32 rows, level L = of 32 level L-1 entries; one thread per
//!             row gallops to its window and merges at most 2 * 31
//!             entries per level.
//! ```
//!
//! Cost: the tile passes take O(1) steps per row for the sums (one add a
//! row in the plain pass, ~17 dependent operations in double-double) and
//! log2(w) + 1 table levels for min/max (w rows per window), the same
//! work on every lane of a warp; the general pass costs O(log w) to find
//! a window and O(32 log_32 w) merges per row, whatever the window. The
//! plain pass is 6-7% faster than the double-double one at windows of
//! ~43-200 rows where its bounds hold (its scans alone would be ~17%;
//! the checks and the direct sums take the rest), level at ~11 rows
//! (BENCHMARKS.md); where they do not hold, a tile pays for both. Rows
//! sorted by (key, ts) with a key column make every group its own series:
//! a window never crosses a key boundary.
//!
//! Calendar windows ([`Window::Calendar`]: `1mo`, `1q`, ...) take the same
//! passes: each row's edge comes from civil-date arithmetic on the device
//! (as `crate::window`), and a tile reaches back to the edge of the start
//! of its first row's day, which bounds every later row's edge (at a
//! clamped month end an edge moves back).

use std::sync::Arc;

use braid_core::cuda::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use braid_core::cuda::{DeviceBuffer, Gpu};

use super::launch::{Build, FLAG_TILE_ROWS, KernelError, Kernels, grid, launched};
use super::ops::{mark_written, wait_inputs};
use crate::rolling::{Agg, Closed};
use crate::window::Window;

/// Entries merged into one of the next level.
const FAN: usize = 32;
/// Bytes of one level entry (`RollAgg` in `kernels.cu`: 8 f64).
const ENTRY: usize = 64;
/// Levels the query kernel can hold, level 0 (rows) included.
const MAX_LEVELS: usize = 8;
/// The shared memory `rolling_tile` needs: per region row (and one past
/// it) the value, two 8-byte slots (ts and key, then the double-double
/// prefix, then the min/max table) and a prefix count; per tile row the
/// window bounds. The ts/key arrays are padded by one slot per 16 and the
/// bounds by one per 32 (`ROLL_PT`, `ROLL_PW`); values and counts are not
/// (`ROLL_XS`), which keeps four default blocks an SM within the 196 KiB
/// carve-out and so a larger L1.
fn tile_shared_bytes(build: Build) -> usize {
    let (cap, tile) = (build.region_rows(), build.tile_rows());
    let slots = cap + (cap >> 4) + 2;
    let unpadded = cap + 2;
    unpadded * 8 + 2 * slots * 8 + unpadded * 4 + (tile + (tile >> 5)) * 4
}

/// Whether a block of the long-window build gets its shared memory on
/// this device: its region (about 106 KiB) plus the kernels' static
/// shared state (tens of bytes; 1 KiB is allowed for it) within the
/// device's opt-in limit per block (227 KiB on an H100 or H200, 99 KiB on
/// compute capability 8.6, 8.9 and 12.0). Where it is not, setting the
/// size failed the whole job.
fn long_region_fits(gpu: &Gpu) -> Result<bool, KernelError> {
    use braid_core::cuda::cudarc::driver::sys::CUdevice_attribute;
    let optin = gpu
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .map_err(|e| {
            KernelError::Cuda(braid_core::cuda::CudaError::Driver {
                rank: gpu.rank(),
                call: "cuDeviceGetAttribute",
                detail: format!("{e:?}"),
            })
        })?;
    let mut limit = usize::try_from(optin).unwrap_or(0);
    // A smaller device's limit, to run its path on a larger one (tests).
    if let Some(l) = std::env::var(SHARED_LIMIT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        limit = limit.min(l);
    }
    Ok(tile_shared_bytes(Build::LongWindows) + 1024 <= limit)
}

/// Caps the shared memory per block that [`long_region_fits`] takes the
/// device to give (bytes), so that a large GPU runs the path of a smaller
/// one: `101376` is compute capability 8.6's limit.
pub const SHARED_LIMIT_ENV: &str = "BRAID_GPU_SHARED_LIMIT";

/// The tile pass's output pointers (`RollOut` in `kernels.cu`): values
/// per slot, then validity per slot; 0 where not wanted. Passed by value,
/// so the kernel reads them from the constant bank.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct TileOutputs([u64; 14]);

// SAFETY: plain old data, laid out as the kernel's `RollOut`.
unsafe impl DeviceRepr for TileOutputs {}

/// A window as the kernels take it (`RollWin` in `kernels.cu`): a fixed
/// length (`months` 0), or calendar months then a fixed part, on a column
/// with `per` units a day. Passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct KernelWindow {
    len: i64,
    per: i64,
    /// `i64::MIN / per`, truncated.
    qmin: i64,
    /// `1 / per`.
    inv: f64,
    months: u32,
    pad: u32,
}

// SAFETY: plain old data, laid out as the kernel's `RollWin`.
unsafe impl DeviceRepr for KernelWindow {}

impl TryFrom<Window> for KernelWindow {
    type Error = String;

    /// The kernels' form of a window; a window on a zone's local clock
    /// has none (its steps need the zone database).
    fn try_from(w: Window) -> Result<Self, String> {
        Ok(match w {
            Window::Zoned { zone, .. } => {
                return Err(format!(
                    "a window of days, weeks or months in time zone {zone} runs on the CPU only (give it in hours, or run with --device cpu)"
                ));
            }
            Window::Fixed(len) => KernelWindow {
                len,
                per: 1,
                qmin: i64::MIN,
                inv: 1.0,
                months: 0,
                pad: 0,
            },
            Window::Calendar { months, then, unit } => {
                let per = unit.per_day();
                KernelWindow {
                    len: then,
                    per,
                    qmin: i64::MIN / per,
                    inv: 1.0 / per as f64,
                    months,
                    pad: 0,
                }
            }
        })
    }
}

/// Whether the kernels take `window`: `Err` says why not (a window on a
/// zone's local clock needs the zone database, which the device lacks).
pub fn check_window(window: Window) -> Result<(), String> {
    KernelWindow::try_from(window).map(|_| ())
}

/// One call's launches.
struct Pass<'a> {
    gpu: &'a Arc<Gpu>,
    input: RollingInput<'a>,
    window: KernelWindow,
    closed: u32,
    /// Where the outputs go (the general pass puts its level pointers in
    /// front of them in its own table).
    outs: TileOutputs,
}

/// The tile passes, in the order they run (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TileStage {
    /// Sums from plain prefix sums, each result checked against its
    /// error bound; over every tile.
    Plain,
    /// Sums from double-double prefix sums; over the tiles the plain pass
    /// left.
    DoubleDouble,
    /// The long-window build (double-double); over the tiles still left.
    LongWindows,
}

/// A flag's reason (`ROLL_LEFT` in `kernels.cu`): a window past the
/// default region, ties past it, NaN, infinity, magnitudes 2^40 apart.
const ROLL_LEFT: u32 = 1;
/// A flag's reason (`ROLL_BOUND`): a plain-scan result past its bound.
const ROLL_BOUND: u32 = 2;

/// The tiles a tile pass runs over.
#[derive(Clone, Copy)]
enum Only<'b> {
    /// Every tile.
    All,
    /// The tiles these flags mark with a reason in the mask.
    Marked(&'b DeviceBuffer, u32),
    /// The tiles its own flags buffer marks so; it marks those it leaves
    /// `ROLL_LEFT` there.
    InPlace(u32),
}

impl Pass<'_> {
    fn args(&self) -> (u64, u64, u64, u64, u64, u64) {
        let i = &self.input;
        (
            i.ts.ptr(),
            i.key.map_or(0, |b| b.ptr()),
            i.values.ptr(),
            i.valid.map_or(0, |b| b.ptr()),
            (i.ts.len() / 8) as u64,
            i.emit_from as u64,
        )
    }

    /// Marks the launch just enqueued: inputs read, outputs written.
    fn mark(
        &self,
        reads: &[&DeviceBuffer],
        written: &mut [&mut DeviceBuffer],
    ) -> Result<(), KernelError> {
        let ev = self.gpu.record(self.gpu.stream())?;
        for b in reads {
            b.note_use(ev.clone());
        }
        for b in written.iter_mut() {
            b.set_ready(ev.clone());
        }
        Ok(())
    }

    /// One tile pass, `stage`, over the tiles `only` names. Its flags go
    /// to `flags` (zeroed, or the ones it runs over: `ROLL_LEFT` written
    /// over those it leaves). Returns how many blocks left tiles, by
    /// reason: `[ROLL_LEFT, ROLL_BOUND]` (read back: one small
    /// device-to-host copy). `tiles` counts flag tiles
    /// ([`FLAG_TILE_ROWS`] rows each), whatever the build's tile.
    fn tiles(
        &self,
        reads: &[&DeviceBuffer],
        written: &mut [&mut DeviceBuffer],
        tiles: usize,
        stage: TileStage,
        flags: &mut DeviceBuffer,
        only: Only<'_>,
    ) -> Result<[u32; 2], KernelError> {
        let rank = self.gpu.rank();
        let build = match stage {
            TileStage::Plain | TileStage::DoubleDouble => Build::Default,
            TileStage::LongWindows => Build::LongWindows,
        };
        let mut flagged = DeviceBuffer::alloc(self.gpu, 8)?;
        flagged.fill(0)?;
        let k = Kernels::get_build(self.gpu, build)?;
        // Fixed windows have entry points without the calendar code.
        let plain = stage == TileStage::Plain;
        let name = match (self.input.key.is_some(), self.window.months != 0, plain) {
            (false, false, true) => "rolling_tile_pl",
            (true, false, true) => "rolling_tile_keyed_pl",
            (false, true, true) => "rolling_tile_cal_pl",
            (true, true, true) => "rolling_tile_keyed_cal_pl",
            (false, false, false) => "rolling_tile",
            (true, false, false) => "rolling_tile_keyed",
            (false, true, false) => "rolling_tile_cal",
            (true, true, false) => "rolling_tile_keyed_cal",
        };
        let f = k.func(rank, name)?;
        let shared = tile_shared_bytes(build);
        // The attribute is the function's, shared by concurrent callers;
        // every caller sets the same size.
        f.set_attribute(
            braid_core::cuda::cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            shared as i32,
        )
        .map_err(|e| {
            KernelError::Cuda(braid_core::cuda::CudaError::Driver {
                rank,
                call: "cuFuncSetAttribute",
                detail: format!("{e:?}"),
            })
        })?;
        let mut all: Vec<&DeviceBuffer> = reads.to_vec();
        all.extend(written.iter().map(|b| &**b));
        all.push(flags);
        all.push(&flagged);
        let marked = match only {
            Only::Marked(b, _) => Some(b),
            Only::All | Only::InPlace(_) => None,
        };
        all.extend(marked);
        wait_inputs(self.gpu, &all)?;
        let (tp, kp, vp, okp, n, e) = self.args();
        let (fp, cp) = (flags.ptr(), flagged.ptr());
        let (op, mask) = match only {
            Only::All => (0, 0u32),
            Only::Marked(b, why) => (b.ptr(), why),
            Only::InPlace(why) => (fp, why),
        };
        let mut b = self.gpu.stream().launch_builder(f);
        b.arg(&tp)
            .arg(&kp)
            .arg(&vp)
            .arg(&okp)
            .arg(&n)
            .arg(&e)
            .arg(&self.window)
            .arg(&self.closed)
            .arg(&self.outs)
            .arg(&fp)
            .arg(&cp)
            .arg(&op)
            .arg(&mask);
        let blocks = tiles.div_ceil(build.tile_rows() / FLAG_TILE_ROWS);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (build.tile_threads(), 1, 1),
            shared_mem_bytes: shared as u32,
        };
        // SAFETY: every pointer is a live buffer of the checked sizes; the
        // tile count covers the output rows; shared memory as declared.
        launched(rank, unsafe { b.launch(cfg) })?;
        let mut reads2 = reads.to_vec();
        reads2.extend(marked);
        self.mark(&reads2, written)?;
        let ev = self.gpu.record(self.gpu.stream())?;
        flags.set_ready(ev.clone());
        flagged.set_ready(ev);
        let n: Vec<u32> = flagged.to_vec()?;
        // No count read back: treat every tile as left (slower, never wrong).
        let count = |i: usize| n.get(i).copied().unwrap_or(1);
        Ok([count(0), count(1)])
    }

    /// The level entries of the general pass (levels 1..).
    fn levels(&self) -> Result<Vec<DeviceBuffer>, KernelError> {
        let (gpu, rank) = (self.gpu, self.gpu.rank());
        let k = Kernels::get(gpu)?;
        let n = self.input.ts.len() / 8;
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
                    let mut ins = vec![self.input.values, &out];
                    ins.extend(self.input.valid);
                    wait_inputs(gpu, &ins)?;
                    let (vp, okp) = (
                        self.input.values.ptr(),
                        self.input.valid.map_or(0, |v| v.ptr()),
                    );
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
        Ok(levels)
    }

    /// The general pass over the flagged tiles.
    fn general(
        &self,
        reads: &[&DeviceBuffer],
        levels: &[DeviceBuffer],
        flags: &DeviceBuffer,
        written: &mut [&mut DeviceBuffer],
    ) -> Result<(), KernelError> {
        let (gpu, rank) = (self.gpu, self.gpu.rank());
        let k = Kernels::get(gpu)?;
        let mut lp = [0u64; MAX_LEVELS];
        for (l, b) in levels.iter().enumerate() {
            lp[l + 1] = b.ptr();
        }
        // The level pointers go in front of the output pointers.
        let table: Vec<u64> = lp.iter().chain(&self.outs.0).copied().collect();
        let d_table = DeviceBuffer::from_slice(gpu, &table)?;
        let mut all: Vec<&DeviceBuffer> = reads.to_vec();
        all.extend(levels.iter());
        all.push(flags);
        all.push(&d_table);
        all.extend(written.iter().map(|b| &**b));
        wait_inputs(gpu, &all)?;
        let f = k.func(rank, "rolling_window")?;
        let (tp, kp, vp, okp, n, e) = self.args();
        let (pp, nl, fp) = (d_table.ptr(), levels.len() as u32 + 1, flags.ptr());
        let mut b = gpu.stream().launch_builder(f);
        b.arg(&tp)
            .arg(&kp)
            .arg(&vp)
            .arg(&okp)
            .arg(&n)
            .arg(&e)
            .arg(&self.window)
            .arg(&self.closed)
            .arg(&pp)
            .arg(&nl)
            .arg(&fp);
        // SAFETY: as in `tiles`; level buffers hold n / 32^L entries.
        launched(rank, unsafe { b.launch(grid((n - e) as usize)) })?;
        let mut reads2: Vec<&DeviceBuffer> = reads.to_vec();
        reads2.extend(levels.iter());
        reads2.push(flags);
        reads2.push(&d_table);
        self.mark(&reads2, written)
    }
}

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

/// Rolling aggregations of `input` over `window` (a fixed length, `1000`
/// or `Window::Fixed(1000)`, or calendar months); one column per entry of
/// `aggs` (a repeated aggregation is computed once and copied). The caller
/// guarantees the sort order (the kernel does not check it; the job sorts
/// on the device right before).
pub fn rolling(
    gpu: &Arc<Gpu>,
    input: RollingInput<'_>,
    window: impl Into<Window>,
    closed: Closed,
    aggs: &[Agg],
) -> Result<Vec<GpuAggColumn>, KernelError> {
    let window: Window = window.into();
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
    if window.length() < 0 {
        return Err(bad(format!("window must be >= 0, got {}", window.length())));
    }
    let kernel_window = KernelWindow::try_from(window).map_err(bad)?;
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
        let mut ptrs = [0u64; 14];
        for (s, o) in outs.iter().enumerate() {
            if let Some((v, ok)) = o {
                ptrs[s] = v.ptr();
                ptrs[7 + s] = ok.as_ref().map_or(0, |b| b.ptr());
            }
        }
        let mut written: Vec<&mut DeviceBuffer> = Vec::new();
        for (v, ok) in outs.iter_mut().flatten() {
            written.push(v);
            if let Some(ok) = ok {
                written.push(ok);
            }
        }
        let tiles = rows.div_ceil(FLAG_TILE_ROWS);
        let mut reads: Vec<&DeviceBuffer> = vec![input.ts, input.values];
        reads.extend(input.key);
        reads.extend(input.valid);
        let pass = Pass {
            gpu,
            input,
            window: kernel_window,
            closed: code(closed),
            outs: TileOutputs(ptrs),
        };
        let mut flags = DeviceBuffer::alloc(gpu, tiles * 4)?;
        flags.fill(0)?;
        let [mut left, bound] = pass.tiles(
            &reads,
            &mut written,
            tiles,
            TileStage::Plain,
            &mut flags,
            Only::All,
        )?;
        if bound > 0 {
            // Results the plain scans could not vouch for.
            let stage = TileStage::DoubleDouble;
            let only = Only::InPlace(ROLL_BOUND);
            left += pass.tiles(&reads, &mut written, tiles, stage, &mut flags, only)?[0];
        }
        if left > 0 {
            // Windows longer than the default region (and the rest): the
            // larger one, then the general pass.
            if long_region_fits(gpu)? {
                let mut long = DeviceBuffer::alloc(gpu, tiles * 4)?;
                long.fill(0)?;
                let stage = TileStage::LongWindows;
                let only = Only::Marked(&flags, ROLL_LEFT);
                if pass.tiles(&reads, &mut written, tiles, stage, &mut long, only)?[0] > 0 {
                    let levels = pass.levels()?;
                    pass.general(&reads, &levels, &long, &mut written)?;
                }
            } else {
                // A device whose blocks cannot hold the larger region (a
                // 99 KiB opt-in limit, as compute capability 8.6, 8.9 and
                // 12.0 have): the general pass takes every flagged tile.
                let levels = pass.levels()?;
                pass.general(&reads, &levels, &flags, &mut written)?;
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
