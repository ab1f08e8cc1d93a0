//! `rolling`: the distributed rolling-window aggregation job.
//!
//! Reads a table (Parquet or CSV file or directory; or, with no `--input`,
//! 10 million generated rows), computes `--aggs` over `--values` in windows
//! of `--window` along `--order` (per `--by` group if given), and writes
//! every input row plus `<value>_<agg>` columns to `--output` (a directory
//! with one part per rank, or one file when the path ends in `.parquet` or
//! `.csv`). Runs on `--ranks` in-process ranks by default.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use arrow_schema::{DataType, TimeUnit};
use braid_coll::ReduceKind;
use braid_core::{BoxError, MemoryLimits};
use braid_examples::{JobArgs, JobOutcome, STOPPED_EXIT, init_tracing, run_job_with_progress};
use braid_examples::{out, outln};
use braid_kernels::rolling::{Agg, CalendarUnit, Closed, Window};
use braid_kernels::window::Zone;
use braid_nodes::job::{Device, JobProgress, Output, RollingJob};
use braid_nodes::rolling::RollingSpec;
use braid_nodes::sink::{FileFormat, FileSink, SinkTarget};
use braid_nodes::source::{GeneratorSpec, Source, has_extension};
use clap::Parser;

/// Distributed rolling-window aggregation.
#[derive(Debug, Parser)]
#[command(name = "rolling", version)]
struct Cli {
    #[command(flatten)]
    job: JobArgs,
    /// Input: a Parquet file (.parquet, .parq, .pq, or any name but the
    /// CSV ones) or a CSV file (.csv or .tsv, or .csv.gz and .tsv.gz
    /// compressed), or a directory of them (files named .* or _* skipped). Without it,
    /// `--rows` rows are generated (columns id, ts, key, v).
    #[arg(long)]
    input: Option<PathBuf>,
    /// Output: a directory (one part file per rank) or a file ending in
    /// .parquet or .csv. Without it the result is computed and counted only.
    #[arg(long)]
    output: Option<PathBuf>,
    /// The order column: any integer type, a date or a timestamp.
    #[arg(long, default_value = "ts")]
    order: String,
    /// The group columns, comma-separated (optional): each window holds
    /// only rows that agree with its row on all of them. A comma inside a
    /// name is written `\,` (a backslash itself `\\`).
    #[arg(long)]
    by: Vec<String>,
    /// Value columns, comma-separated (`\,` for a comma inside a name).
    #[arg(long, default_value = "v")]
    values: Vec<String>,
    /// Window: an integer in the order column's units (days for a date
    /// column; `10i` on integer columns), or for timestamp and date
    /// columns a duration such as 250ms, 90s, 1h30m, 1.5h, 2d, 1w, "1 hour",
    /// or calendar months: 1mo, 1q, 1y, 1mo15d (months back on the calendar,
    /// then the rest). On a timestamp column in a time zone other than UTC,
    /// days, weeks and months step on the zone's local clock (a day across
    /// a daylight-saving change is 23 or 25 hours), as Polars does.
    #[arg(long, default_value = "1000", allow_hyphen_values = true)]
    window: String,
    /// Which window ends are closed: right, both, left, none.
    #[arg(long, default_value = "right")]
    closed: Closed,
    /// Aggregations, comma-separated: sum, mean, min, max, count, std, var.
    #[arg(long, value_delimiter = ',', default_value = "sum,mean,min,max,count")]
    aggs: Vec<Agg>,
    /// Rows per chunk (the unit that flows between nodes; each costs a few
    /// KB and tens of microseconds, and a spilled one a file, so below
    /// ~1000 rows the overhead outweighs the rows).
    #[arg(long, default_value_t = 64 * 1024, allow_negative_numbers = true)]
    chunk_rows: usize,
    /// Host memory limit per rank for shuffled data (bytes, or with a
    /// unit: 512MiB, 2GB, 1e9); what is over it spills to $TMPDIR (not a
    /// cap on the whole process: the sort and the kernel hold their data).
    #[arg(long, allow_negative_numbers = true)]
    memory_limit: Option<String>,
    /// Generated rows (without --input).
    #[arg(
        long,
        default_value_t = 10_000_000,
        conflicts_with = "input",
        allow_negative_numbers = true
    )]
    rows: u64,
    /// Generated distinct keys, at least 1 (without --input).
    #[arg(long, default_value_t = 100, conflicts_with = "input", value_parser = clap::value_parser!(u64).range(1..), allow_negative_numbers = true)]
    keys: u64,
    /// Generator seed (without --input).
    #[arg(
        long,
        default_value_t = 42,
        conflicts_with = "input",
        allow_negative_numbers = true
    )]
    seed: u64,
    /// Generate ts as `timestamp[us]` instead of int64 (without --input).
    #[arg(long, conflicts_with = "input")]
    timestamp: bool,
    /// Where to compute: cpu, or gpu (needs a build with `--features
    /// cuda`; one rank per GPU unless `--ranks` says otherwise: ranks
    /// beyond the host's GPUs share them and move device data through host
    /// memory, several times slower).
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    device: Device,
}

fn parse_device(s: &str) -> Result<Device, String> {
    match s.to_ascii_lowercase().as_str() {
        "cpu" => Ok(Device::Cpu),
        "gpu" => Ok(Device::Gpu),
        _ => Err(format!("unknown device {s:?} (cpu or gpu)")),
    }
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let digits = |from: usize| {
        s[from..]
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .map_or(s.len(), |i| from + i)
    };
    let mut split = digits(0);
    // An exponent (`1e9`, `2.5E+10`) belongs to the number.
    let rest = &s.as_bytes()[split..];
    if let [b'e' | b'E', tail @ ..] = rest {
        let sign = usize::from(matches!(tail.first(), Some(b'+' | b'-')));
        if tail.get(sign).is_some_and(u8::is_ascii_digit) {
            split = digits(split + 1 + sign);
        }
    }
    let (num, unit) = s.split_at(split);
    let num: f64 = num
        .parse()
        .ok()
        .filter(|x: &f64| x.is_finite())
        .ok_or_else(|| format!("bad memory size {s:?}"))?;
    let mul: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" => 1e12,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown memory unit {other:?} in {s:?} (b, k, kb, kib, m, mb, mib, g, gb, gib, t, tb, tib)"
            ));
        }
    };
    let bytes = num * mul;
    // (A fraction of a byte is no size anyone means: `0.5` is more likely
    // half of some unit left out than 0 bytes; and a size past u64 would
    // silently become the largest one.)
    if bytes.fract() != 0.0 && mul == 1.0 {
        return Err(format!(
            "bad memory size {s:?}: a number of bytes is whole (with a unit, such as {num}GiB, it may have a fraction)"
        ));
    }
    if bytes >= u64::MAX as f64 {
        return Err(format!(
            "memory size {s:?} is too large (at most {} bytes)",
            u64::MAX
        ));
    }
    Ok(bytes as u64)
}

/// The window. Forms, as Polars and DuckDB write them:
/// - an integer, in the order column's units (days on a date column), or
///   on integer columns, with Polars' index suffix (`10i`);
/// - on timestamp and date columns, a duration: one or more terms of a
///   number and a unit, `90s`, `1h30m`, `1.5h`, `2w`, `1 hour 30 minutes`
///   (units ns, us, ms, s, m, h, d, w and their English names);
/// - there also calendar units, whole numbers of months, quarters and
///   years (`1mo`, `2q`, `1y`, `1y6mo`, `3 months`; `1.5y`, where a
///   fraction makes whole months, as DuckDB reads it), alone or before fixed
///   terms (`1mo15d`): months back on the calendar, then the rest
///   (`Window::Calendar`, as DuckDB's `ts - INTERVAL` and Polars do).
///
/// A fixed duration that is not a whole number of the column's units is rounded
/// to the integer window that selects the same rows: up where the
/// window's far end is open (`right`, `none`: t - w < ts), down where it
/// is closed (`both`, `left`: t - w <= ts); order values are integers, so
/// either way the window holds exactly the rows the exact duration does.
/// A window of length 0 holds a row's equal-ts rows with `--closed both`
/// (DuckDB's `RANGE BETWEEN 0 PRECEDING AND CURRENT ROW`) and no row with
/// any other mode: every output would be null, which a user who typed it
/// did not mean (Polars refuses a zero period). The library keeps the
/// rule's plain meaning; the command line refuses a window written as 0.
/// A window of another length that holds no rows all the same (`1` with
/// `--closed none` on integers, `12h` with `--closed left` on dates) gives
/// nulls, as Polars and DuckDB compute it.
fn check_window_holds_rows(w: &Window, closed: Closed, given: &str) -> Result<(), String> {
    let written_zero = || {
        let g = given.trim();
        let int = g.strip_suffix(['i', 'I']).unwrap_or(g);
        match int.parse::<u64>() {
            Ok(v) => v == 0,
            Err(_) => duration(g).is_ok_and(|d| d.total == 0 && d.months == 0),
        }
    };
    if *w == Window::Fixed(0) && closed != Closed::Both && written_zero() {
        return Err(format!(
            "window {given:?} is 0: with --closed {} it holds no rows (every result null); \
             use --closed both for the rows of equal order value, or a longer window",
            closed.name()
        ));
    }
    Ok(())
}

/// A plain integer window on a timestamp column counts the column's own
/// units (`t - w < ts` on the stored values), so the default 1000 on a
/// `timestamp[us]` column is a millisecond, which a user who meant seconds
/// would not notice (Polars and DuckDB refuse a bare integer there). The job
/// says so once, where it starts (not in every tcp or MPI rank process).
fn note_integer_window(
    given: &str,
    order: &str,
    order_type: &DataType,
    backend: braid_core::Backend,
) {
    let DataType::Timestamp(unit, _) = order_type else {
        return;
    };
    let digits = given.trim().trim_start_matches('+');
    // (0 is 0 in any unit.)
    let plain = digits.bytes().all(|b| b.is_ascii_digit()) && digits.bytes().any(|b| b != b'0');
    // Rank 0's process, or the one process of in-process ranks (a tcp job
    // started here spawns its rank processes, rank 0 among them).
    let first = match std::env::var("BRAID_RANK") {
        Ok(r) => r.trim() == "0",
        Err(_) => match backend {
            braid_core::Backend::Tcp => false,
            _ => braid_core::world::mpi_launch_rank().is_none_or(|r| r == 0),
        },
    };
    if plain && first {
        let unit = match unit {
            TimeUnit::Second => "s",
            TimeUnit::Millisecond => "ms",
            TimeUnit::Microsecond => "us",
            TimeUnit::Nanosecond => "ns",
        };
        tracing::warn!(
            "window {digits} on the timestamp column {order:?} counts its units: {digits} {unit}; \
             give a duration (such as {digits}s, 15m or 1h) for a longer one"
        );
    }
}

fn parse_window(s: &str, order_type: &DataType, closed: Closed) -> Result<Window, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("the window is empty".into());
    }
    if s.starts_with('-') {
        return Err(format!("window must be >= 0, got {s}"));
    }
    // An explicit sign, as Rust's and Python's integers take it.
    let s = s.strip_prefix('+').unwrap_or(s);
    // A plain integer, or Polars' index form `10i` (integer columns only:
    // on a timestamp it would read as 10 of its units, which a user who
    // meant 10 rows would not notice; Polars refuses it there too).
    let int = s.strip_suffix(['i', 'I']).unwrap_or(s);
    if !int.is_empty() && int.bytes().all(|b| b.is_ascii_digit()) {
        if int.len() < s.len() && !order_type.is_integer() {
            return Err(format!(
                "window {s:?}: the `i` form is for integer order columns; give a duration or a plain integer for this {order_type} column"
            ));
        }
        return match int.parse::<i64>() {
            // A Date64 column stores whole days in milliseconds; its
            // integer windows count days, as on a Date32 column (and as
            // DuckDB and Polars, which read it as a date, count them).
            Ok(v) if *order_type == DataType::Date64 => v
                .checked_mul(86_400_000)
                .map(Window::Fixed)
                .ok_or_else(|| format!("window {s} days is too large")),
            Ok(v) => Ok(Window::Fixed(v)),
            Err(_) => Err(format!("window {s} is too large (at most {})", i64::MAX)),
        };
    }
    // Nanoseconds per unit of the order column, and the unit.
    let (per_unit, unit): (i128, CalendarUnit) = match order_type {
        DataType::Timestamp(TimeUnit::Second, _) => (1_000_000_000, CalendarUnit::Seconds),
        DataType::Timestamp(TimeUnit::Millisecond, _) | DataType::Date64 => {
            (1_000_000, CalendarUnit::Millis)
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => (1_000, CalendarUnit::Micros),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => (1, CalendarUnit::Nanos),
        DataType::Date32 => (86_400_000_000_000, CalendarUnit::Days),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            return Err(format!(
                "the order column is text ({order_type}), not a timestamp, date or integer: a CSV column is read as text where a value in a file's first 10,000 rows is neither a number nor a date or timestamp (year first, 2024-03-09, or day first, 09/03/2024; to the nanosecond at most)"
            ));
        }
        _ => {
            return Err(format!(
                "window {s:?} is not an integer; durations need a timestamp or date order column (this one is {order_type})"
            ));
        }
    };
    let d = duration(s)?;
    // A zone other than UTC: months, weeks and days step on its local
    // clock (Window::Zoned); the rest is absolute time.
    let local = match order_type {
        DataType::Timestamp(_, Some(z)) if d.months > 0 || d.day_nanos > 0 => {
            let zone: Zone = z.parse().map_err(|e| format!("order column: {e}"))?;
            (!zone.is_utc()).then_some(zone)
        }
        _ => None,
    };
    let fixed = if local.is_some() {
        d.total - d.day_nanos
    } else {
        d.total
    };
    let open_far_end = matches!(closed, Closed::Right | Closed::None);
    let units = if open_far_end {
        fixed / per_unit + i128::from(fixed % per_unit != 0)
    } else {
        fixed / per_unit
    };
    let units = i64::try_from(units).map_err(|_| format!("window {s:?} is too large"))?;
    if let Some(zone) = local {
        let Some((weeks, days)) = d.weeks_days else {
            return Err(format!(
                "window {s:?}: on a column in time zone {zone} days and weeks are steps of the local calendar and must be whole (give fractions in hours)"
            ));
        };
        let whole = |n: i128| u32::try_from(n).map_err(|_| format!("window {s:?} is too large"));
        return Ok(Window::Zoned {
            months: d.months,
            weeks: whole(weeks)?,
            days: whole(days)?,
            then: units,
            unit,
            zone,
        });
    }
    Ok(match d.months {
        0 => Window::Fixed(units),
        months => Window::Calendar {
            months,
            then: units,
            unit,
        },
    })
}

/// A parsed duration: calendar months, the weeks and days (local-clock
/// steps on a column with a time zone), and everything in nanoseconds.
#[derive(Debug, Default)]
struct WindowTerms {
    months: u32,
    /// Whole weeks and days given as `w` and `d` terms (`None`: one of
    /// them has a fraction).
    weeks_days: Option<(i128, i128)>,
    /// Nanoseconds of the `w` and `d` terms.
    day_nanos: i128,
    /// All nanoseconds, the `w` and `d` terms included.
    total: i128,
}

/// A duration written as a clock, `HH:MM` or `HH:MM:SS[.fraction]` (as
/// DuckDB's `INTERVAL '01:30:00'`), in the terms [`duration`] reads
/// (`1h30m0s`); `None` for any other form.
fn clock_duration(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split(':').collect();
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit());
    let two = |p: &str| p.len() == 2 && digits(p) && p < "60";
    match parts.as_slice() {
        [h, m] if digits(h) && two(m) => Some(format!("{h}h{m}m")),
        [h, m, sec] if digits(h) && two(m) => {
            let (whole, frac) = sec.split_once('.').unwrap_or((sec, "0"));
            (two(whole) && digits(frac)).then(|| format!("{h}h{m}m{whole}.{frac}s"))
        }
        _ => None,
    }
}

/// Parses a duration of one or more `<number><unit>` terms (`1h30m`,
/// `1.5h`, `2 weeks`, `1y6mo`); a number may have a fraction as long as
/// the term is a whole number of nanoseconds (months: a whole number of
/// months).
fn duration(s: &str) -> Result<WindowTerms, String> {
    const UNITS: &str = "ns, us, ms, s, m, h, d, w, mo, q, y";
    // Clock terms, alone or after others as DuckDB prints an interval
    // (`2 days 03:00:00`), become `h`, `m` and `s` terms.
    if s.contains(':') {
        let terms: Option<Vec<String>> = s
            .split_whitespace()
            .map(|t| match t.contains(':') {
                true => clock_duration(t),
                false => Some(t.to_string()),
            })
            .collect();
        return match terms {
            Some(t) => duration(&t.join(" ")),
            None => Err(format!(
                "bad window {s:?}: a clock term is HH:MM or HH:MM:SS[.fraction]"
            )),
        };
    }
    let mut rest = s;
    let mut total: i128 = 0;
    let mut months: u32 = 0;
    let mut weeks_days = Some((0i128, 0i128));
    let mut day_nanos: i128 = 0;
    let too_large = || format!("window {s:?} is too large");
    while !rest.trim_start().is_empty() {
        rest = rest.trim_start();
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(n);
        if num.is_empty() {
            return Err(format!("bad window {s:?}: expected a number at {rest:?}"));
        }
        let after = after.trim_start();
        let u = after
            .find(|c: char| !c.is_alphabetic())
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(u);
        rest = next;
        let nanos: i128 = match unit.to_ascii_lowercase().as_str() {
            "ns" | "nanosecond" | "nanoseconds" => 1,
            "us" | "µs" | "usec" | "usecs" | "microsecond" | "microseconds" => 1_000,
            "ms" | "msec" | "msecs" | "millisecond" | "milliseconds" => 1_000_000,
            "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000_000,
            "m" | "min" | "mins" | "minute" | "minutes" => 60_000_000_000,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000_000_000,
            "d" | "day" | "days" => DAY_NS,
            "w" | "week" | "weeks" => 7 * DAY_NS,
            calendar @ ("mo" | "mon" | "mons" | "month" | "months" | "q" | "quarter"
            | "quarters" | "y" | "yr" | "yrs" | "year" | "years") => {
                let per: u32 = if calendar.starts_with('q') {
                    3
                } else if calendar.starts_with('y') {
                    12
                } else {
                    1
                };
                // A fraction where it makes whole months (1.5y is 18
                // months, as DuckDB reads it; 1.5mo is refused).
                let bad = || format!("window {s:?}: {num}{unit} is not a whole number of months");
                let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
                let whole: u32 = match whole {
                    "" if !frac.is_empty() => 0,
                    w => w.parse().map_err(|_| bad())?,
                };
                let frac_months: u32 = if frac.is_empty() {
                    0
                } else {
                    let f: u64 = frac
                        .parse()
                        .ok()
                        .filter(|_| frac.len() <= 9 && frac.bytes().all(|c| c.is_ascii_digit()))
                        .ok_or_else(bad)?;
                    let scaled = f * u64::from(per);
                    let scale = 10u64.pow(frac.len() as u32);
                    if scaled % scale != 0 {
                        return Err(bad());
                    }
                    (scaled / scale) as u32
                };
                months = whole
                    .checked_mul(per)
                    .and_then(|m| m.checked_add(frac_months))
                    .and_then(|m| months.checked_add(m))
                    .ok_or_else(too_large)?;
                continue;
            }
            "" => return Err(format!("bad window {s:?}: {num:?} has no unit ({UNITS})")),
            other => {
                return Err(format!(
                    "unknown duration unit {other:?} in window {s:?} ({UNITS})"
                ));
            }
        };
        // num = whole.frac: whole * nanos + frac * nanos / 10^len(frac)
        // (trailing zeros of the fraction change nothing).
        let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
        let frac = frac.trim_end_matches('0');
        if frac.contains('.') || (whole.is_empty() && frac.is_empty()) || frac.len() > 18 {
            return Err(format!("bad window {s:?}: bad number {num:?}"));
        }
        let whole: i128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| too_large())?
        };
        let scale = 10i128.pow(frac.len() as u32);
        let frac_n: i128 = if frac.is_empty() {
            0
        } else {
            frac.parse()
                .map_err(|_| format!("bad window {s:?}: bad number {num:?}"))?
        };
        let frac_ns = frac_n * nanos;
        if frac_ns % scale != 0 {
            return Err(format!(
                "window {s:?}: {num}{unit} is not a whole number of nanoseconds"
            ));
        }
        let term = whole
            .checked_mul(nanos)
            .and_then(|w| w.checked_add(frac_ns / scale))
            .ok_or_else(too_large)?;
        total = total.checked_add(term).ok_or_else(too_large)?;
        if nanos >= DAY_NS {
            day_nanos += term;
            weeks_days = match weeks_days {
                Some((w, d)) if frac_n == 0 && nanos == DAY_NS => Some((w, d + whole)),
                Some((w, d)) if frac_n == 0 => Some((w + whole, d)),
                _ => None,
            };
        }
    }
    Ok(WindowTerms {
        months,
        weeks_days,
        day_nanos,
        total,
    })
}

/// `p` as an absolute path with links resolved, where it may not exist
/// yet (an output, and directories the job will make for it): its
/// nearest existing ancestor's canonical path, then the rest of `p`, `..`
/// taking back the directory before it (as it will once those directories
/// exist: `out/new/..` is `out`). `None` only where the working directory
/// cannot be read.
fn resolved(p: &Path) -> Option<PathBuf> {
    use std::path::Component;
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(p)
    };
    let parts: Vec<Component> = abs.components().collect();
    for k in (1..=parts.len()).rev() {
        let Ok(mut out) = parts[..k].iter().collect::<PathBuf>().canonicalize() else {
            continue;
        };
        for c in &parts[k..] {
            match c {
                Component::ParentDir => {
                    out.pop();
                }
                Component::Normal(n) => out.push(n),
                _ => {}
            }
        }
        return Some(out);
    }
    None
}

/// Refuses an output that is the input, or lies inside an input
/// directory: the result would overwrite the data it is computed from (or
/// be read as input by the next run).
fn check_apart(input: &Path, output: &Path) -> Result<(), BoxError> {
    let (Some(i), Some(o)) = (resolved(input), resolved(output)) else {
        return Ok(());
    };
    if o == i {
        return Err(format!("--output {} is the input", output.display()).into());
    }
    // The commit replaces the output directory's part files of either
    // format: an input among them would be deleted, or overwritten.
    if i.starts_with(&o) {
        return Err(format!(
            "--input {} lies inside the output {} (the output's part files are replaced when the job commits)",
            input.display(),
            output.display()
        )
        .into());
    }
    if i.is_dir() && o.starts_with(&i) {
        return Err(format!(
            "--output {} lies inside the input directory {}",
            output.display(),
            input.display()
        )
        .into());
    }
    Ok(())
}

/// Refuses an `--output` whose name ends like a file braid does not
/// write (`out.csv.gz`, `out.pq`, `out.json`): it would otherwise become a
/// directory of Parquet parts under that name.
fn check_output_name(p: &Path) -> Result<(), BoxError> {
    if braid_nodes::sink::ends_in_separator(p) {
        return Ok(());
    }
    const FILE_ENDINGS: [&str; 18] = [
        "gz", "bz2", "xz", "zst", "zip", "lz4", "snappy", "pq", "parq", "tsv", "txt", "json",
        "jsonl", "ndjson", "arrow", "feather", "ipc", "orc",
    ];
    match FILE_ENDINGS.iter().find(|x| has_extension(p, x)) {
        Some(x) => Err(format!(
            "--output {}: braid writes a .parquet or .csv file, or a directory of part files, not a .{x} file (name a file .parquet or .csv, or give a directory whose name does not end in .{x})",
            p.display()
        )
        .into()),
        None => Ok(()),
    }
}

/// Nanoseconds in a day.
const DAY_NS: i128 = 86_400_000_000_000;

fn build(cli: &Cli) -> Result<(RollingJob, MemoryLimits, Option<u64>), BoxError> {
    cli.job.check()?;
    if let (Some(i), Some(o)) = (&cli.input, &cli.output) {
        check_apart(i, o)?;
    }
    let source = match &cli.input {
        Some(p) => Source::at(p.clone()),
        None => Source::Generator(GeneratorSpec {
            rows: cli.rows,
            keys: cli.keys,
            // (past i64::MAX rows, `as` made the span 1: every ts equal)
            span: i64::try_from(cli.rows)
                .unwrap_or(i64::MAX)
                .saturating_mul(10)
                .max(1),
            seed: cli.seed,
            null_fraction: 0.05,
            timestamp: cli.timestamp,
        }),
    };
    let schema = source.schema()?;
    let (by, values) = (column_list(&cli.by), column_list(&cli.values));
    // Each named column, checked here so that the error names its option
    // (`--by ,` names no column at all).
    for (option, names) in [
        ("--order", std::slice::from_ref(&cli.order)),
        ("--by", &by[..]),
        ("--values", &values[..]),
    ] {
        for name in names {
            if name.is_empty() {
                return Err(format!(
                    "{option} names an empty column (columns are separated by commas)"
                )
                .into());
            }
            braid_nodes::partition::column_index(&schema, name).map_err(|e| {
                let hint = if option != "--order"
                    && schema.fields().iter().any(|f| f.name().contains(','))
                {
                    " (a comma inside a column name is written \\,)"
                } else {
                    ""
                };
                format!("{option}: {}{hint}", source.explain(e))
            })?;
        }
    }
    let order_type = schema
        .field(braid_nodes::partition::column_index(&schema, &cli.order)?)
        .data_type()
        .clone();
    let window = parse_window(&cli.window, &order_type, cli.closed)?;
    check_window_holds_rows(&window, cli.closed, &cli.window)?;
    note_integer_window(&cli.window, &cli.order, &order_type, cli.job.backend());
    let spec = RollingSpec {
        order: cli.order.clone(),
        by,
        values,
        window,
        closed: cli.closed,
        aggs: cli.aggs.clone(),
    };
    let output = match &cli.output {
        None => Output::Discard,
        Some(p) => {
            check_output_name(p)?;
            let format = if has_extension(p, "csv") {
                FileFormat::Csv
            } else {
                FileFormat::Parquet
            };
            Output::File(FileSink {
                format,
                target: SinkTarget::from_path(p.clone(), format),
                schema: spec.output_schema(&schema).map_err(|e| source.explain(e))?,
            })
        }
    };
    let limits = MemoryLimits {
        device: None,
        host: cli.memory_limit.as_deref().map(parse_bytes).transpose()?,
    };
    // For the progress bar only: a footer that cannot be read fails the
    // job later, with its own error.
    let total = source.known_rows().ok().flatten();
    let job = RollingJob {
        source,
        spec,
        output,
        chunk_rows: cli.chunk_rows,
        device: cli.device,
    };
    job.check()?;
    Ok((job, limits, total))
}

/// Resolves when this process is asked to stop (SIGINT, SIGTERM), so the
/// job ends as a failure that cleans up instead of leaving its staging
/// area behind; never where the handlers cannot be installed.
async fn stop_signal() -> &'static str {
    let by = {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            // SIGHUP too: what a closed terminal or a dropped ssh session
            // sends (the tcp launcher's ranks and braid-launch took it;
            // in-process ranks died of it, leaving staging and spill
            // files behind).
            // A signal the process was started ignoring (`nohup`'s
            // SIGHUP) stays ignored: the user asked the job to outlive it.
            let mut streams: Vec<(&'static str, tokio::signal::unix::Signal)> = [
                (SignalKind::interrupt(), "SIGINT"),
                (SignalKind::terminate(), "SIGTERM"),
                (SignalKind::hangup(), "SIGHUP"),
            ]
            .into_iter()
            .filter(|(k, _)| !braid_core::launch::signal_ignored(k.as_raw_value()))
            .filter_map(|(k, name)| Some((name, signal(k).ok()?)))
            .collect();
            if streams.is_empty() {
                return std::future::pending().await;
            }
            let waits = streams.iter_mut().map(|(name, s)| {
                Box::pin(async move {
                    s.recv().await;
                    *name
                })
            });
            futures::future::select_all(waits).await.0
        }
        #[cfg(not(unix))]
        {
            match tokio::signal::ctrl_c().await {
                Ok(()) => "Ctrl-C",
                Err(_) => std::future::pending().await,
            }
        }
    };
    STOPPED.store(true, Ordering::Relaxed);
    // A commit moving files into place is let finish (milliseconds; a
    // rank stopped then, while others keep their parts, could leave a
    // directory output mixed), within a bound: a job that then ends well
    // exits 0 with its output whole.
    let wait = Instant::now();
    while braid_nodes::sink::placing_outputs() > 0 && wait.elapsed() < COMMIT_WAIT {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    by
}

/// How long a stop signal waits for a commit that is moving files.
const COMMIT_WAIT: Duration = Duration::from_secs(30);

/// Set once a stop signal came: the job then exits with [`STOPPED_EXIT`].
static STOPPED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// This process's peak resident memory (Linux), in MiB.
fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

/// `--device gpu` runs one rank per GPU unless `--ranks` is given: ranks
/// beyond the host's GPUs share them and move device data through host
/// memory (several times slower), so the default 4 ranks would be the slow
/// path on a host with fewer GPUs. More ranks than GPUs, asked for, get a
/// warning. (Not under MPI, where mpirun decides; and only where the ranks
/// are started, not in each tcp rank process.)
fn gpu_ranks(cli: &mut Cli, ranks_given: bool) {
    #[cfg(feature = "cuda")]
    if cli.device == Device::Gpu
        && cli.job.backend() != braid_core::Backend::Mpi
        && std::env::var_os("BRAID_RANK").is_none()
    {
        let gpus = u32::try_from(braid_core::cuda::Gpu::count()).unwrap_or(u32::MAX);
        if !ranks_given {
            cli.job.ranks = Some(gpus.max(1));
        } else if gpus > 0 && cli.job.ranks() > gpus {
            tracing::warn!(
                "{} ranks on {gpus} GPU(s): ranks that share a GPU move device data \
                 through host memory (several times slower); one rank per GPU \
                 (--ranks {gpus}, the default with --device gpu) is the fast path",
                cli.job.ranks()
            );
        }
    }
    #[cfg(not(feature = "cuda"))]
    let _ = (cli, ranks_given);
}

fn main() -> ExitCode {
    init_tracing();
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let mut cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let ranks_given = matches
        .value_source("ranks")
        .is_some_and(|s| s != clap::parser::ValueSource::DefaultValue);
    gpu_ranks(&mut cli, ranks_given);
    // A failed job removes the directories it created for its output (the
    // output directory and its missing parents, or a one-file output's
    // missing parents): still empty, as nothing is moved into them before
    // every rank succeeded. Deepest first; `remove_dir` leaves any that
    // is not empty.
    let created: Vec<PathBuf> = cli
        .output
        .iter()
        .flat_map(|p| p.ancestors())
        .filter(|a| !a.as_os_str().is_empty() && !a.exists())
        .map(Path::to_path_buf)
        .collect();
    let remove_created = || {
        for p in &created {
            let _ = std::fs::remove_dir(p);
        }
    };
    let (job, limits, total) = match build(&cli) {
        Ok(x) => x,
        Err(e) => {
            remove_created();
            match braid_core::world::mpi_launch_rank() {
                Some(r) => {
                    let line = format!("error: rank {r}: {e}\n");
                    braid_examples::err!("{line}")
                }
                None => {
                    let line = format!("error: {e}\n");
                    braid_examples::err!("{line}")
                }
            }
            return ExitCode::FAILURE;
        }
    };
    // Rows read and written: the launcher's sums of its tcp ranks'
    // reports, or this process's ranks' counts (`job_progress`). Past the
    // reading, the sort, halo and kernel are what the bar waits for; the
    // rows written (passed to the output) show the kernel's progress.
    let progress = Arc::new(braid_core::rank_progress::Progress::default());
    let job_progress = Arc::new(JobProgress::new());
    let bar =
        indicatif::ProgressBar::with_draw_target(total, indicatif::ProgressDrawTarget::stderr());
    // A CSV input's rows are known only once read: a count, no bar.
    let template = if total.is_some() {
        "{spinner} {elapsed_precise} [{bar:30}] {pos}/{len} rows read{msg}"
    } else {
        "{spinner} {elapsed_precise} {pos} rows read{msg}"
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let ticker = {
        let (bar, p, jp) = (bar.clone(), progress.clone(), job_progress.clone());
        // A rank process of a tcp job tells its launcher, which shows the
        // job's bar (its own stderr is not a terminal).
        let reporter = braid_core::rank_progress::ProgressReporter::from_env();
        let counts = move || {
            (
                p.read.load(Ordering::Relaxed) + jp.read(),
                p.written.load(Ordering::Relaxed) + jp.written(),
            )
        };
        std::thread::spawn(move || {
            let mut told = None;
            while !bar.is_finished() {
                let (read, written) = counts();
                bar.set_position(read);
                if written > 0 {
                    bar.set_message(format!(", {written} rows computed"));
                } else if total.is_some_and(|t| t > 0 && read >= t) {
                    bar.set_message(", sorting and exchanging rows between ranks");
                }
                if let Some(r) = reporter.as_ref().filter(|_| told != Some((read, written))) {
                    r.report(read, written);
                    told = Some((read, written));
                }
                // Unparked when the job ends, so the exit waits for no tick.
                std::thread::park_timeout(Duration::from_millis(100));
            }
            // The last counts, which the loop may not have reached.
            let now = counts();
            if let Some(r) = reporter.as_ref().filter(|_| told != Some(now)) {
                r.report(now.0, now.1);
            }
        })
    };
    let start = Instant::now();
    let p2 = job_progress.clone();
    let sink = match &job.output {
        Output::File(f) => Some(f.clone()),
        _ => None,
    };
    // Under MPI a failed job's abort ends the process before the error
    // path below: the same cleanup, run before it.
    {
        let (sink, created) = (sink.clone(), created.clone());
        braid_core::world::on_process_abort(move || {
            braid_coll::remove_spill_dirs();
            if let Some(s) = &sink {
                s.abandon();
            }
            for p in &created {
                let _ = std::fs::remove_dir(p);
            }
        });
    }
    let res = run_job_with_progress(&cli.job, limits, Some(progress.clone()), move |ctx| {
        let job = job.clone();
        let p = p2.clone();
        async move {
            // A stop signal drops the job's future: its staged output is
            // removed (the sink's `Staged` guard), and the error path
            // below removes the rest.
            let counts = tokio::select! {
                r = job.run(ctx.clone(), Some(p)) => r?,
                s = stop_signal() => return Err(format!("stopped by {s}").into()),
            };
            let stats = ctx.statistics().to_string();
            // The job's totals on every rank: a process of a tcp or MPI
            // job holds one rank's counts only.
            let totals = braid_coll::allreduce(
                &ctx,
                vec![counts.rows_in as i64, counts.rows_out as i64],
                ReduceKind::Sum,
            )
            .await?;
            Ok((
                counts,
                Totals::new(&totals, ctx.nranks(), ctx.comm().backend()),
                stats,
            ))
        }
    });
    let secs = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    ticker.thread().unpark();
    let _ = ticker.join();
    match res {
        Ok(JobOutcome::Ran(per_rank)) => {
            for (r, (c, _, stats)) in &per_rank {
                outln!("rank {r}: {} rows in, {} rows out", c.rows_in, c.rows_out);
                out!("{stats}");
            }
            // The job's line, once: where rank 0 ran (every process of a
            // tcp or MPI job runs one rank).
            if let Some((_, (_, t, _))) = per_rank.iter().find(|(r, _)| *r == 0) {
                outln!(
                    "rolling: {} rows in, {} rows out, {} rank{} ({}), {secs:.3} s, {:.0} rows/s, peak RSS {} MiB{}",
                    t.rows_in,
                    t.rows_out,
                    t.nranks,
                    if t.nranks == 1 { "" } else { "s" },
                    t.backend,
                    t.rows_in as f64 / secs.max(1e-9),
                    peak_rss_mib()
                        .map(|m| m.to_string())
                        .unwrap_or_else(|| "?".into()),
                    if per_rank.len() < t.nranks as usize {
                        " (rank 0's process)"
                    } else {
                        ""
                    }
                );
            }
            ExitCode::SUCCESS
        }
        Ok(JobOutcome::Launched) => {
            outln!(
                "rolling: {} tcp ranks finished in {secs:.3} s",
                cli.job.ranks()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            // Blocking work of the failed job may still run (its ranks'
            // runtimes did not wait for it): what it spilled goes now.
            braid_coll::remove_spill_dirs();
            if let Some(s) = sink {
                s.abandon();
            }
            remove_created();
            // One write: the ranks of an MPI job share the terminal.
            let line = format!("error: {e}\n");
            braid_examples::err!("{line}");
            if STOPPED.load(Ordering::Relaxed) {
                ExitCode::from(STOPPED_EXIT)
            } else {
                // (A stopped tcp launcher: STOPPED_EXIT too.)
                braid_examples::exit_code(&*e)
            }
        }
    }
}

/// The job's row counts summed over its ranks, and how many ranks it had.
struct Totals {
    rows_in: u64,
    rows_out: u64,
    nranks: u32,
    /// How the ranks talked (under `braid-launch`, tcp whatever
    /// `--backend` said).
    backend: braid_core::Backend,
}

impl Totals {
    /// From the AllReduce of every rank's `[rows_in, rows_out]`.
    fn new(summed: &[i64], nranks: u32, backend: braid_core::Backend) -> Totals {
        let at = |i: usize| summed.get(i).map_or(0, |v| (*v).max(0) as u64);
        Totals {
            rows_in: at(0),
            rows_out: at(1),
            nranks,
            backend,
        }
    }
}

/// The column names of `--by` or `--values` (each given once or more):
/// split at commas, where `\,` is a comma inside a name and `\\` a
/// backslash (CSV headers such as "price, USD" are names too); any other
/// backslash is kept as written.
fn column_list(raw: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for s in raw {
        let mut name = String::new();
        let mut chars = s.chars();
        while let Some(c) = chars.next() {
            match c {
                ',' => out.push(std::mem::take(&mut name)),
                '\\' => match chars.clone().next() {
                    Some(e @ (',' | '\\')) => {
                        chars.next();
                        name.push(e);
                    }
                    _ => name.push(c),
                },
                c => name.push(c),
            }
        }
        out.push(name);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commas split names unless escaped; escapes of a comma or a
    /// backslash are read, other backslashes kept; every occurrence of the
    /// option adds its names.
    #[test]
    fn column_lists_split_at_unescaped_commas() {
        let l = |v: &[&str]| column_list(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(l(&["a,b"]), ["a", "b"]);
        assert_eq!(l(&["price\\, USD,b"]), ["price, USD", "b"]);
        assert_eq!(l(&["a\\\\,b"]), ["a\\", "b"]);
        assert_eq!(l(&["a\\b", "c"]), ["a\\b", "c"]);
        assert_eq!(l(&["a,"]), ["a", ""]);
        assert_eq!(l(&[","]), ["", ""]);
        assert_eq!(l(&["x\\"]), ["x\\"]);
    }

    const MS: DataType = DataType::Timestamp(TimeUnit::Millisecond, None);

    /// A fixed window's length (a calendar window is an error here).
    fn pw(s: &str, t: &DataType, closed: Closed) -> Result<i64, String> {
        match parse_window(s, t, closed)? {
            Window::Fixed(w) => Ok(w),
            w => Err(format!("calendar window {w:?}")),
        }
    }

    /// An output that does not exist yet resolves through its nearest
    /// existing ancestor, `..` taking back the directory before it: an
    /// input inside `out/new/..` is inside `out`, and an output under a
    /// directory the job will make inside the input is inside the input.
    #[test]
    fn outputs_that_do_not_exist_yet_are_kept_apart_from_the_input() {
        let d = std::env::temp_dir().join(format!("braid-apart-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("in")).unwrap();
        std::fs::write(d.join("in/part-00000.parquet"), b"x").unwrap();
        let d = d.canonicalize().unwrap();
        assert_eq!(resolved(&d.join("in/new/..")), Some(d.join("in")));
        assert_eq!(resolved(&d.join("in/a/b/./c")), Some(d.join("in/a/b/c")));
        let file = d.join("in/part-00000.parquet");
        for (input, output) in [
            (file.clone(), d.join("in/nothere/..")),
            (d.join("in"), d.join("in/results/sub/")),
            (d.join("in"), d.join("in/results/out.parquet")),
            (file.clone(), d.join("in/x/../part-00000.parquet")),
        ] {
            assert!(
                check_apart(&input, &output).is_err(),
                "{} and {}",
                input.display(),
                output.display()
            );
        }
        check_apart(&d.join("in"), &d.join("out/new/result.parquet")).unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Sizes with units and exponents; malformed ones are refused.
    #[test]
    fn memory_sizes_parse() {
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_bytes(" 1.5 kib "), Ok(1536));
        assert_eq!(parse_bytes("1e9"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("2.5E+3k"), Ok(2_500_000));
        assert_eq!(parse_bytes("4e-1k"), Ok(400));
        assert_eq!(parse_bytes("123"), Ok(123));
        assert_eq!(parse_bytes("1TB"), Ok(1_000_000_000_000));
        assert_eq!(parse_bytes("2TiB"), Ok(2 << 40));
        for bad in [
            "",
            "-1",
            "e9",
            "1e",
            "1ex",
            "nan",
            "1e999",
            "1.2.3",
            "5 parsecs",
            "0.5",
            "1.5b",
            "2e-1",
            "1e20",
            "18446744073709551616",
            "20000000TB",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("1e19"), Ok(10_000_000_000_000_000_000));
        assert_eq!(parse_bytes("0.5GiB"), Ok(1 << 29));
        assert!(
            parse_bytes("0.5").is_err_and(|e| e.contains("0.5GiB")),
            "{:?}",
            parse_bytes("0.5")
        );
    }

    #[test]
    fn days_weeks_and_months_in_a_zone_step_on_its_local_clock() {
        let ny = DataType::Timestamp(TimeUnit::Millisecond, Some("America/New_York".into()));
        let zone: Zone = "America/New_York".parse().unwrap();
        let zoned = |months, weeks, days, then| {
            Ok(Window::Zoned {
                months,
                weeks,
                days,
                then,
                unit: CalendarUnit::Millis,
                zone,
            })
        };
        let w = |s: &str, t: &DataType| parse_window(s, t, Closed::Right);
        assert_eq!(w("1d", &ny), zoned(0, 0, 1, 0));
        assert_eq!(w("1w1d2h", &ny), zoned(0, 1, 1, 7_200_000));
        assert_eq!(w("1mo 3 days", &ny), zoned(1, 0, 3, 0));
        // Hours alone are absolute, as are days on UTC columns.
        assert_eq!(w("24h", &ny), Ok(Window::Fixed(86_400_000)));
        let utc = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
        assert_eq!(w("1d", &utc), Ok(Window::Fixed(86_400_000)));
        // A local day has no fraction.
        assert!(w("1.5d", &ny).unwrap_err().contains("must be whole"));
        let ist = DataType::Timestamp(TimeUnit::Millisecond, Some("+05:30".into()));
        assert!(matches!(
            w("1mo", &ist),
            Ok(Window::Zoned {
                zone: Zone::Fixed(19_800),
                ..
            })
        ));
        // An unknown zone matters only to a window that needs it.
        let mars = DataType::Timestamp(TimeUnit::Millisecond, Some("Mars/Olympus".into()));
        assert_eq!(w("3h", &mars), Ok(Window::Fixed(10_800_000)));
        assert!(w("1d", &mars).unwrap_err().contains("unknown time zone"));
    }

    /// DuckDB's spellings: `msec`/`usec` units and the clock form.
    #[test]
    fn duckdb_interval_spellings_parse() {
        let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
        let w = |s: &str| parse_window(s, &ts, Closed::Right);
        assert_eq!(w("300000 msec"), Ok(Window::Fixed(300_000_000)));
        assert_eq!(w("300000000 usecs"), Ok(Window::Fixed(300_000_000)));
        assert_eq!(w("01:30:00"), Ok(Window::Fixed(5_400_000_000)));
        assert_eq!(w("1:30"), Ok(Window::Fixed(5_400_000_000)));
        assert_eq!(w("00:00:01.5"), Ok(Window::Fixed(1_500_000)));
        assert_eq!(w("36:00:00"), Ok(Window::Fixed(129_600_000_000)));
        // As DuckDB prints an interval: day terms, then a clock.
        assert_eq!(w("2 days 03:00:00"), Ok(Window::Fixed(183_600_000_000)));
        assert_eq!(w("1 day 00:00:00.5"), Ok(Window::Fixed(86_400_500_000)));
        assert_eq!(
            w("1 year 2 months 3 days 04:05:06.5"),
            Ok(Window::Calendar {
                months: 14,
                then: 273_906_500_000,
                unit: CalendarUnit::Micros,
            })
        );
        for bad in [
            "2 days 03:0",
            "2 days 3:00 4:00:",
            "01:60:00",
            "1:2",
            "01:30:",
            ":30",
            "01:30:00:00",
            "01:3a:00",
        ] {
            assert!(w(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn calendar_units_count_months_then_the_rest() {
        let cal = |s: &str, t: &DataType, closed: Closed| parse_window(s, t, closed);
        let months = |months, then, unit| Ok(Window::Calendar { months, then, unit });
        use CalendarUnit::{Days, Micros, Millis};
        let us = DataType::Timestamp(TimeUnit::Microsecond, None);
        assert_eq!(cal("1mo", &us, Closed::Right), months(1, 0, Micros));
        assert_eq!(cal("2q", &us, Closed::Right), months(6, 0, Micros));
        assert_eq!(cal("1y6mo", &us, Closed::Right), months(18, 0, Micros));
        assert_eq!(cal("3 months", &us, Closed::Right), months(3, 0, Micros));
        assert_eq!(cal("1 year", &us, Closed::Right), months(12, 0, Micros));
        assert_eq!(cal("2 mons", &us, Closed::Right), months(2, 0, Micros));
        // Months first, whatever the order of the terms, then the rest.
        let day = 86_400_000_000;
        assert_eq!(
            cal("1mo15d", &us, Closed::Right),
            months(1, 15 * day, Micros)
        );
        assert_eq!(
            cal("15d 1mo", &us, Closed::Both),
            months(1, 15 * day, Micros)
        );
        // The fixed part rounds as a fixed window does.
        assert_eq!(cal("1mo1500us", &MS, Closed::Right), months(1, 2, Millis));
        assert_eq!(cal("1mo1500us", &MS, Closed::Left), months(1, 1, Millis));
        assert_eq!(
            cal("1mo", &DataType::Date32, Closed::Right),
            months(1, 0, Days)
        );
        assert_eq!(
            cal("1mo", &DataType::Date64, Closed::Right),
            months(1, 0, Millis)
        );
        // Whole months only (a fraction of a year or quarter where it
        // makes them, as DuckDB reads it), and not on integer columns.
        for bad in ["1.5mo", "0.1q", "1.05y", "1.0000000001y", ".y"] {
            let e = cal(bad, &us, Closed::Right);
            assert!(
                e.as_ref()
                    .is_err_and(|e| e.contains("whole number of months")),
                "{bad}: {e:?}"
            );
        }
        assert_eq!(cal("1.5y", &us, Closed::Right), months(18, 0, Micros));
        assert_eq!(cal("0.5y", &us, Closed::Right), months(6, 0, Micros));
        assert_eq!(cal("1.0mo", &us, Closed::Right), months(1, 0, Micros));
        assert_eq!(cal("2.25y1q", &us, Closed::Right), months(30, 0, Micros));
        let e = cal("1mo", &DataType::Int64, Closed::Right);
        assert!(
            e.as_ref().is_err_and(|e| e.contains("timestamp or date")),
            "{e:?}"
        );
        let e = cal("4294967295y", &us, Closed::Right);
        assert!(e.as_ref().is_err_and(|e| e.contains("too large")), "{e:?}");
    }

    #[test]
    fn durations_round_to_the_window_that_selects_the_same_rows() {
        // 1.5 ms: t - 1.5 < ts (right) holds for ts >= t - 1, i.e. t - 2 < ts.
        assert_eq!(pw("1500us", &MS, Closed::Right), Ok(2));
        assert_eq!(pw("1500us", &MS, Closed::None), Ok(2));
        // t - 1.5 <= ts (both, left) holds for ts >= t - 1.
        assert_eq!(pw("1500us", &MS, Closed::Both), Ok(1));
        assert_eq!(pw("1500us", &MS, Closed::Left), Ok(1));
        assert_eq!(pw("999us", &MS, Closed::Right), Ok(1));
        assert_eq!(pw("999us", &MS, Closed::Left), Ok(0));
        assert_eq!(pw("2s", &MS, Closed::Right), Ok(2000));
        assert_eq!(pw("2s", &MS, Closed::Both), Ok(2000));
        assert_eq!(pw("0ms", &MS, Closed::Right), Ok(0));
        let s = DataType::Timestamp(TimeUnit::Second, Some("UTC".into()));
        assert_eq!(pw("90s", &s, Closed::Right), Ok(90));
        assert_eq!(pw("1ns", &s, Closed::Right), Ok(1));
        assert_eq!(pw("1ns", &s, Closed::Both), Ok(0));
        // Dates: durations in the stored unit (days for Date32, ms for
        // Date64); integers count days on both.
        assert_eq!(pw("3d", &DataType::Date32, Closed::Right), Ok(3));
        assert_eq!(pw("36h", &DataType::Date32, Closed::Right), Ok(2));
        assert_eq!(pw("36h", &DataType::Date32, Closed::Both), Ok(1));
        assert_eq!(pw("2s", &DataType::Date64, Closed::Right), Ok(2000));
        assert_eq!(
            pw("3", &DataType::Date64, Closed::Right),
            Ok(3 * 86_400_000)
        );
        assert_eq!(pw("3", &DataType::Date32, Closed::Right), Ok(3));
    }

    #[test]
    fn durations_take_the_forms_polars_and_duckdb_write() {
        let ms = |w: &str| pw(w, &MS, Closed::Right);
        // Compound terms, in any order, with or without spaces.
        assert_eq!(ms("1h30m"), Ok(5_400_000));
        assert_eq!(ms("30m1h"), Ok(5_400_000));
        assert_eq!(ms("1d2h3m4s5ms"), Ok(((26 * 60 + 3) * 60 + 4) * 1000 + 5));
        assert_eq!(ms("1h 30m"), Ok(5_400_000));
        // Fractions that are whole nanoseconds; weeks; English names.
        assert_eq!(ms("1.5h"), Ok(5_400_000));
        assert_eq!(ms("0.25s"), Ok(250));
        assert_eq!(ms(".5s"), Ok(500));
        assert_eq!(ms("2w"), Ok(14 * 86_400_000));
        assert_eq!(ms("1 hour 30 minutes"), Ok(5_400_000));
        assert_eq!(ms("2 days"), Ok(2 * 86_400_000));
        assert_eq!(ms("90 SECONDS"), Ok(90_000));
        assert_eq!(ms("1500µs"), Ok(2));
        // Polars' index suffix on an integer order column.
        assert_eq!(pw("10i", &DataType::Int64, Closed::Right), Ok(10));
        assert_eq!(pw("10I", &DataType::Int64, Closed::Right), Ok(10));
        assert_eq!(pw("7i", &DataType::UInt16, Closed::Right), Ok(7));
        for temporal in [DataType::Date32, DataType::Date64, MS] {
            let e = pw("3i", &temporal, Closed::Right);
            assert!(
                e.as_ref()
                    .is_err_and(|e| e.contains("for integer order columns")),
                "{temporal}: {e:?}"
            );
        }
        // Trailing zeros of a fraction, however many.
        assert_eq!(ms("1.50000000000000000000000h"), Ok(5_400_000));
        // The same duration spelled two ways gives one window.
        let us = DataType::Timestamp(TimeUnit::Microsecond, None);
        for closed in [Closed::Right, Closed::Both, Closed::Left, Closed::None] {
            assert_eq!(pw("1.000001s", &us, closed), pw("1s1us", &us, closed));
        }
    }

    #[test]
    fn bad_windows_say_what_is_wrong() {
        let e = pw("9223372036854775808", &DataType::Int64, Closed::Right);
        assert!(e.as_ref().is_err_and(|e| e.contains("too large")), "{e:?}");
        let e = pw("-5", &DataType::Int64, Closed::Right);
        assert!(e.as_ref().is_err_and(|e| e.contains(">= 0")), "{e:?}");
        let e = pw("5m", &DataType::Int64, Closed::Right);
        assert!(
            e.as_ref()
                .is_err_and(|e| e.contains("durations need a timestamp or date")),
            "{e:?}"
        );
        let e = pw("5m", &DataType::Utf8, Closed::Right);
        assert!(
            e.as_ref()
                .is_err_and(|e| e.contains("the order column is text")),
            "{e:?}"
        );
        let err = |w: &str, want: &str| {
            let e = pw(w, &MS, Closed::Right);
            assert!(e.as_ref().is_err_and(|e| e.contains(want)), "{w}: {e:?}");
        };
        err("5x", "unknown duration unit \"x\"");
        err("1h5", "has no unit");
        err("h", "expected a number");
        err("1.2.3h", "bad number");
        err(".h", "bad number");
        err("-5m", ">= 0");
        err(" ", "empty");
        err("1.5ns", "not a whole number of nanoseconds");
        let e = pw("999999999999d", &MS, Closed::Right);
        assert!(e.as_ref().is_err_and(|e| e.contains("too large")), "{e:?}");
        assert_eq!(pw(" 42 ", &DataType::Int64, Closed::Right), Ok(42));
    }
}
