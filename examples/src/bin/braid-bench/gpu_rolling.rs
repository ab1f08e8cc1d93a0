//! GPU rolling-kernel benchmark (feature `cuda`): the rolling kernel over
//! N sorted rows (all seven aggregations of one f64 column) next to a
//! device-to-device copy measured in the same run, both as bytes read plus
//! written per second. The kernel's bytes: ts and value read (16 B/row),
//! seven outputs written (7 x 8 B) plus six validity bytes per row (fewer
//! with `--aggs`). With `--keys K` the rows carry a key column (K runs
//! of equal keys, ts rising within each) and the kernel also reads it
//! (8 B/row more).

use std::time::Instant;

use braid_core::BoxError;
use braid_core::cuda::{DeviceBuffer, Gpu};
use braid_examples::{median, outln};
use braid_kernels::gpu::{RollingInput, rolling};
use braid_kernels::rolling::{Agg, Closed};
use braid_kernels::{CalendarUnit, Window};

/// Options of `braid-bench gpu-rolling`.
#[derive(Debug, clap::Args)]
pub struct GpuRollingArgs {
    /// Rows.
    #[arg(long, default_value_t = 100_000_000)]
    n: usize,
    /// Window in ts units; ts grows by 0..=3 per row (1.5 on average), so
    /// the default holds about 43 rows.
    #[arg(long, default_value_t = 64)]
    window: i64,
    /// Timed repetitions (after one warm-up; at least 1).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// Aggregations to compute (comma-separated; default all seven). The
    /// bytes counted follow: 8 per row and aggregation, plus a validity
    /// byte per row for each but count.
    #[arg(long, value_delimiter = ',')]
    aggs: Vec<Agg>,
    /// Calendar months instead of `--window`: ts counts days, and each
    /// row's window reaches `M` months back on the calendar (a month holds
    /// about 20 rows), to compare with a fixed window of as many rows
    /// (`--window 30`).
    #[arg(long, default_value_t = 0)]
    months: u32,
    /// Distinct keys (0: no key column). Rows come sorted by (key, ts):
    /// K runs of n / K rows, each with its own rising ts.
    #[arg(long, default_value_t = 0)]
    keys: usize,
    /// ts grows by `U` x (0..=3) per row: above 1 the tile pass's index of
    /// ts holds several units a bucket, as sparse timestamps (say,
    /// nanoseconds) make it; give `--window` in the same units (`--ts-unit
    /// 1000 --window 64000` holds about 43 rows).
    #[arg(long, default_value_t = 1)]
    ts_unit: i64,
}

/// Runs the benchmark on device 0.
pub fn run(a: GpuRollingArgs) -> Result<(), BoxError> {
    if a.ts_unit < 1 || a.n as i128 * 3 * a.ts_unit as i128 > i64::MAX as i128 {
        return Err(format!(
            "--ts-unit must be at least 1, and n x 3 x ts-unit fit in an i64 (got {})",
            a.ts_unit
        )
        .into());
    }
    let gpu = Gpu::for_rank(0)?;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let run = a.n.div_ceil(a.keys.max(1)).max(1);
    let mut t = 0i64;
    let ts: Vec<i64> = (0..a.n)
        .map(|i| {
            if a.keys > 0 && i % run == 0 {
                t = 0;
            }
            t += (next() % 4) as i64 * a.ts_unit;
            t
        })
        .collect();
    let key: Vec<i64> = if a.keys > 0 {
        (0..a.n).map(|i| (i / run) as i64).collect()
    } else {
        Vec::new()
    };
    let v: Vec<f64> = (0..a.n)
        .map(|_| (next() % 1_000_000) as f64 / 1000.0)
        .collect();
    let d_ts = DeviceBuffer::from_slice(&gpu, &ts)?;
    let d_v = DeviceBuffer::from_slice(&gpu, &v)?;
    let d_key = if a.keys > 0 {
        Some(DeviceBuffer::from_slice(&gpu, &key)?)
    } else {
        None
    };
    drop((ts, v, key));
    let aggs: Vec<Agg> = if a.aggs.is_empty() {
        Agg::ALL.to_vec()
    } else {
        a.aggs.clone()
    };
    // (ts grows by 1.5 a row on average; a month is 30.44 days.)
    let (window, label, rows_per_window) = if a.months > 0 {
        let w = Window::Calendar {
            months: a.months,
            then: 0,
            unit: CalendarUnit::Days,
        };
        (
            w,
            format!("{} months (days)", a.months),
            a.months as f64 * 30.44 / 1.5,
        )
    } else {
        (
            Window::Fixed(a.window),
            a.window.to_string(),
            a.window as f64 / 1.5,
        )
    };
    let mut kernel = Vec::new();
    for rep in 0..=a.reps {
        gpu.stream().synchronize()?;
        let t0 = Instant::now();
        let input = RollingInput {
            ts: &d_ts,
            key: d_key.as_ref(),
            values: &d_v,
            valid: None,
            emit_from: 0,
        };
        let out = rolling(&gpu, input, window, Closed::Right, &aggs)?;
        gpu.stream().synchronize()?;
        if rep > 0 {
            kernel.push(t0.elapsed().as_secs_f64());
        }
        drop(out);
    }
    // The copy: 1 GiB device to device, read + written.
    let size = 1usize << 30;
    let src = DeviceBuffer::alloc(&gpu, size)?;
    let mut dst = DeviceBuffer::alloc(&gpu, size)?;
    let mut copy = Vec::new();
    for rep in 0..=a.reps {
        gpu.stream().synchronize()?;
        let t0 = Instant::now();
        dst.copy_from(&src, gpu.stream())?;
        gpu.stream().synchronize()?;
        if rep > 0 {
            copy.push(t0.elapsed().as_secs_f64());
        }
    }
    let mut distinct = aggs.clone();
    distinct.sort_by_key(|g| g.name());
    distinct.dedup();
    let nulls = distinct.iter().filter(|g| **g != Agg::Count).count();
    let read = if a.keys > 0 { 24.0 } else { 16.0 };
    let bytes = a.n as f64 * (read + 8.0 * distinct.len() as f64 + nulls as f64);
    let k = median(kernel);
    let c = median(copy);
    let kb = bytes / k / 1e9;
    let cb = 2.0 * size as f64 / c / 1e9;
    outln!(
        "# braid-bench gpu-rolling on {}: {} rows{}, window {} (~{:.0} rows), aggregations {} of one f64 column",
        gpu.context().name().unwrap_or_default(),
        a.n,
        if a.keys > 0 {
            format!(" in {} keys", a.keys)
        } else {
            String::new()
        },
        label,
        rows_per_window,
        distinct
            .iter()
            .map(|g| g.name())
            .collect::<Vec<_>>()
            .join(",")
    );
    outln!();
    outln!("| what | median ms | GB/s (read + written) | ratio to copy |");
    outln!("|---|---:|---:|---:|");
    outln!("| D2D copy, 1 GiB | {:.2} | {cb:.0} | 1.00 |", c * 1e3);
    outln!(
        "| rolling kernel (levels + windows) | {:.2} | {kb:.0} | {:.2} |",
        k * 1e3,
        kb / cb
    );
    Ok(())
}
