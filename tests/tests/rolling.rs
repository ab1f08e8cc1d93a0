//! The rolling job against a brute-force reference written here: every rank
//! count, local and tcp, every closed mode, grouped and ungrouped; windows
//! covering no rows, about 10 rows, rows on several other ranks, and all the
//! data; ranks with no rows; all rows with one ts; null values and keys;
//! unsorted input; order columns of every integer type, dates and
//! timestamps; float group keys with 0.0, -0.0 and several NaNs; calendar
//! windows (months back by chrono's calendar, not braid's), also on the
//! local clock of time zones with daylight saving.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail by panicking

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Array, ArrayRef, Float64Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use braid_core::world::contexts;
use braid_core::{Context, MemoryLimits, WorldSpec};
use braid_kernels::rolling::{Agg, CalendarUnit, Closed, Window};
use braid_kernels::window::Zone;
use braid_nodes::job::{Output, RollingJob};
use braid_nodes::rolling::RollingSpec;
use braid_nodes::sink::CollectSink;
use braid_nodes::source::Source;
use braid_tests::{RANK_COUNTS, SplitMix, runtime, seed_of, shutdown_all, tcp_contexts};

#[derive(Debug, Clone, Copy)]
struct Row {
    id: i64,
    ts: i64,
    key: Option<i64>,
    v: Option<f64>,
}

#[derive(Debug, Clone, Copy)]
enum Data {
    /// Uniform ts, nulls in values and keys.
    Uniform,
    /// Every row has the same ts (one rank ends up with all rows).
    AllEqual,
    /// Five rows: most ranks have none.
    Tiny,
    /// 2000 rows, nine in ten of them in key 0 (the rest in keys 1 to 3 and
    /// null), ts nearly all distinct: the large group must spread over the
    /// ranks.
    Skewed,
}

fn rows(data: Data, seed: u64) -> (Vec<Row>, i64) {
    let mut g = SplitMix(seed);
    let (n, span) = match data {
        Data::Uniform => (400usize, 4000i64),
        Data::AllEqual => (60, 1),
        Data::Tiny => (5, 50),
        Data::Skewed => (2000, 200_000),
    };
    let rows = (0..n)
        .map(|i| Row {
            id: i as i64,
            ts: match data {
                Data::AllEqual => 1234,
                _ => g.below(span as u64) as i64 - span / 3,
            },
            key: match (data, g.below(10)) {
                (Data::Skewed, 0) => [None, Some(1), Some(2), Some(3)][g.below(4) as usize],
                (Data::Skewed, _) => Some(0),
                (_, 0) => None,
                _ => Some(g.below(4) as i64),
            },
            v: if g.below(8) == 0 {
                None
            } else {
                Some((g.below(2_000_000) as f64 - 1e6) / 1e3)
            },
        })
        .collect();
    (rows, span)
}

/// Whether and by what the job groups.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Grouping {
    None,
    /// By the int64 key.
    Int,
    /// By a float64 key: key 0 is 0.0 or -0.0, key 1 a NaN with one of
    /// several bit patterns, key k > 1 is k + 0.5. DuckDB and Polars group
    /// 0.0 with -0.0 and every NaN together, so the int key's groups are the
    /// reference.
    Float,
    /// By two columns together: `key` (int64, the int key halved) and
    /// `key2` (float64: 0.0 or -0.0 for even int keys, a NaN of one of
    /// several bit patterns for odd ones, 7.5 where the int key is null).
    /// Each int key, null included, is one pair, so the int key's groups
    /// are the reference.
    Pair,
    /// By a list<f64> key: `[float key]` (see `Float`), a null list where
    /// the int key is null; DuckDB and Polars compare the floats inside a
    /// list as they compare float keys.
    List,
}

impl Grouping {
    /// The spec's group columns.
    fn by(self) -> Vec<String> {
        match self {
            Grouping::None => Vec::new(),
            Grouping::Int | Grouping::Float | Grouping::List => vec!["key".into()],
            Grouping::Pair => vec!["key".into(), "key2".into()],
        }
    }
}

/// `key2` of a row (see `Grouping::Pair`; 1.0 where it is not grouped by).
fn pair_key2(r: &Row, grouping: Grouping) -> Option<f64> {
    if grouping != Grouping::Pair {
        return Some(1.0);
    }
    Some(match r.key {
        None => 7.5,
        Some(k) if k % 2 == 0 => {
            if r.id % 2 == 0 {
                0.0
            } else {
                -0.0
            }
        }
        Some(_) => match r.id % 3 {
            0 => f64::NAN,
            1 => -f64::NAN,
            _ => f64::from_bits(0x7ff8_0000_dead_beef),
        },
    })
}

/// The float form of a row's key (see `Grouping::Float`).
fn float_key(r: &Row) -> Option<f64> {
    r.key.map(|k| match (k, r.id % 3) {
        (0, 0) => -0.0,
        (0, _) => 0.0,
        (1, 0) => f64::NAN,
        (1, 1) => -f64::NAN,
        (1, _) => f64::from_bits(0x7ff8_0000_dead_beef),
        (k, _) => k as f64 + 0.5,
    })
}

/// The order column as a timestamp in ms.
const MS: DataType = DataType::Timestamp(TimeUnit::Millisecond, None);

fn schema(ts: &DataType, grouping: Grouping) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("ts", ts.clone(), false),
        Field::new(
            "key",
            match grouping {
                Grouping::Float => DataType::Float64,
                Grouping::List => DataType::new_list(DataType::Float64, true),
                _ => DataType::Int64,
            },
            true,
        ),
        Field::new("v", DataType::Float64, true),
        Field::new("key2", DataType::Float64, true),
    ]))
}

/// The rows with their order values as `ts` (which must hold them).
fn batch(rows: &[Row], ts: &DataType, grouping: Grouping) -> RecordBatch {
    let order: ArrayRef = Arc::new(Int64Array::from(
        rows.iter().map(|r| r.ts).collect::<Vec<_>>(),
    ));
    let order = arrow_cast::cast(&order, ts).unwrap();
    assert_eq!(order.null_count(), 0, "{ts} holds every order value");
    let key: ArrayRef = if grouping == Grouping::Float {
        Arc::new(Float64Array::from(
            rows.iter().map(float_key).collect::<Vec<_>>(),
        ))
    } else if grouping == Grouping::List {
        let mut lists =
            arrow_array::builder::ListBuilder::new(arrow_array::builder::Float64Builder::new());
        for r in rows {
            match float_key(r) {
                Some(x) => {
                    lists.values().append_value(x);
                    lists.append(true);
                }
                None => lists.append_null(),
            }
        }
        Arc::new(lists.finish())
    } else if grouping == Grouping::Pair {
        Arc::new(Int64Array::from(
            rows.iter()
                .map(|r| r.key.map(|k| k / 2))
                .collect::<Vec<_>>(),
        ))
    } else {
        Arc::new(Int64Array::from(
            rows.iter().map(|r| r.key).collect::<Vec<_>>(),
        ))
    };
    RecordBatch::try_new(
        schema(ts, grouping),
        vec![
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.id).collect::<Vec<_>>(),
            )),
            order,
            key,
            Arc::new(Float64Array::from(
                rows.iter().map(|r| r.v).collect::<Vec<_>>(),
            )),
            Arc::new(Float64Array::from(
                rows.iter()
                    .map(|r| pair_key2(r, grouping))
                    .collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap()
}

const AGGS: [Agg; 7] = [
    Agg::Sum,
    Agg::Mean,
    Agg::Min,
    Agg::Max,
    Agg::Count,
    Agg::Std,
    Agg::Var,
];

/// `t - w` as a wide integer. A calendar window (microseconds only here)
/// goes through chrono's calendar: months back with the day clamped to
/// the month's end, as DuckDB's `ts - INTERVAL`, then the fixed part.
fn lower_edge(t: i64, w: Window) -> i128 {
    match w {
        Window::Fixed(w) => t as i128 - w as i128,
        Window::Calendar {
            months,
            then,
            unit: CalendarUnit::Micros,
        } => {
            let dt = chrono::DateTime::from_timestamp_micros(t)
                .unwrap()
                .naive_utc();
            let back = dt.checked_sub_months(chrono::Months::new(months)).unwrap();
            back.and_utc().timestamp_micros() as i128 - then as i128
        }
        Window::Zoned {
            months,
            weeks,
            days,
            then,
            unit: CalendarUnit::Micros,
            zone: Zone::Named(tz),
        } => zoned_lower_edge(t, months, weeks, days, tz) as i128 - then as i128,
        w => panic!("the reference takes microseconds, not {w:?}"),
    }
}

/// RFC 5545 steps on `tz`'s local clock by chrono's calendar: months (day
/// clamped), then weeks, then days, each mapped back to an instant; a
/// repeated local time keeps the offset of the instant the step started
/// from; a skipped one is read with the offset in force just before the
/// gap, found by walking forward minute by minute to the gap's end.
fn zoned_lower_edge(t: i64, months: u32, weeks: u32, days: u32, tz: chrono_tz::Tz) -> i64 {
    use chrono::{LocalResult, Offset, TimeZone, Timelike};
    let mut at = tz.timestamp_micros(t).unwrap();
    let steps = [
        (months, None),
        (weeks, Some(chrono::Days::new(7 * u64::from(weeks)))),
        (days, Some(chrono::Days::new(u64::from(days)))),
    ];
    for (n, by) in steps {
        if n == 0 {
            continue;
        }
        let local = at.naive_local();
        let target = match by {
            None => local.checked_sub_months(chrono::Months::new(n)).unwrap(),
            Some(d) => local.checked_sub_days(d).unwrap(),
        };
        let prev = at.offset().fix();
        at = match tz.from_local_datetime(&target) {
            LocalResult::Single(x) => x,
            LocalResult::Ambiguous(a, b) => {
                if b.offset().fix() == prev {
                    b
                } else {
                    a
                }
            }
            LocalResult::None => {
                // (From the whole minute: gaps end on one.)
                let mut end = target
                    .with_second(0)
                    .and_then(|x| x.with_nanosecond(0))
                    .unwrap();
                while let LocalResult::None = tz.from_local_datetime(&end) {
                    end += chrono::TimeDelta::minutes(1);
                }
                let first = tz.from_local_datetime(&end).earliest().unwrap();
                let before = tz
                    .offset_from_utc_datetime(&(first.naive_utc() - chrono::TimeDelta::seconds(1)))
                    .fix();
                let u = target - chrono::TimeDelta::seconds(i64::from(before.local_minus_utc()));
                tz.from_utc_datetime(&u)
            }
        };
    }
    at.timestamp_micros()
}

/// Whether order value `x` is in the window of a row at `t` whose lower
/// edge is `lo`.
fn in_window(lo: i128, t: i64, x: i64, closed: Closed) -> bool {
    let (t, x) = (t as i128, x as i128);
    match closed {
        Closed::Right => lo < x && x <= t,
        Closed::Both => lo <= x && x <= t,
        Closed::Left => lo <= x && x < t,
        Closed::None => lo < x && x < t,
    }
}

/// The expected aggregates of every row, by id, computed directly.
fn brute(rows: &[Row], grouped: bool, w: Window, closed: Closed) -> HashMap<i64, Vec<Option<f64>>> {
    let mut out = HashMap::new();
    for r in rows {
        let lo = lower_edge(r.ts, w);
        let vals: Vec<f64> = rows
            .iter()
            .filter(|o| (!grouped || o.key == r.key) && in_window(lo, r.ts, o.ts, closed))
            .filter_map(|o| o.v)
            .collect();
        let n = vals.len();
        let sum: f64 = vals.iter().sum();
        let mean = sum / n as f64;
        let var = if n >= 2 {
            Some(vals.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64)
        } else {
            None
        };
        let some = |x: f64| if n > 0 { Some(x) } else { None };
        out.insert(
            r.id,
            vec![
                some(sum),
                some(mean),
                some(vals.iter().cloned().fold(f64::INFINITY, f64::min)),
                some(vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max)),
                Some(n as f64),
                var.map(f64::sqrt),
                var,
            ],
        );
    }
    out
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 + 1e-9 * b.abs()
}

async fn run_case(
    ctxs: &[Context],
    rows: &[Row],
    ts: &DataType,
    grouping: Grouping,
    w: impl Into<Window>,
    closed: Closed,
    what: &str,
) -> Vec<usize> {
    let n = ctxs.len();
    let w = w.into();
    let spec = RollingSpec {
        order: "ts".into(),
        by: grouping.by(),
        values: vec!["v".into()],
        window: w,
        closed,
        aggs: AGGS.to_vec(),
    };
    let mut hs = Vec::new();
    let mut sinks = Vec::new();
    for (r, ctx) in ctxs.iter().enumerate() {
        // Unsorted input, unevenly spread: rank r gets ids = r mod n, and
        // odd ranks get nothing when n > 2.
        let mine: Vec<Row> = rows
            .iter()
            .filter(|x| {
                let owner = if n > 2 {
                    (x.id as usize % n.div_ceil(2)) * 2
                } else {
                    x.id as usize % n
                };
                owner == r
            })
            .copied()
            .collect();
        let sink = CollectSink::new();
        sinks.push(sink.clone());
        let job = RollingJob {
            source: Source::Memory(schema(ts, grouping), vec![batch(&mine, ts, grouping)]),
            spec: spec.clone(),
            output: Output::Collect(sink),
            chunk_rows: 37,
            device: braid_nodes::job::Device::Cpu,
        };
        let ctx = ctx.clone();
        hs.push(tokio::spawn(async move { job.run(ctx, None).await }));
    }
    let mut total_in = 0;
    for h in hs {
        let c = tokio::time::timeout(Duration::from_secs(60), h)
            .await
            .unwrap_or_else(|_| panic!("{what}: a rank hung"))
            .unwrap()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        total_in += c.rows_in;
    }
    assert_eq!(total_in as usize, rows.len(), "{what}");
    let want = brute(rows, grouping != Grouping::None, w, closed);
    let mut seen = 0;
    let mut per_rank = Vec::with_capacity(n);
    for s in sinks {
        let before = seen;
        for b in s.batches() {
            let ids = b
                .column_by_name("id")
                .unwrap()
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .clone();
            for (k, agg) in AGGS.iter().enumerate() {
                let col = b.column_by_name(&format!("v_{}", agg.name())).unwrap();
                let col = arrow_cast_f64(col);
                for i in 0..b.num_rows() {
                    let id = ids.value(i);
                    let exp = want[&id][k];
                    let got = (!col.is_null(i)).then(|| col.value(i));
                    match (exp, got) {
                        (None, None) => {}
                        (Some(e), Some(g)) if close(g, e) => {}
                        _ => panic!("{what}: row {id} {}: got {got:?}, want {exp:?}", agg.name()),
                    }
                }
            }
            seen += b.num_rows();
        }
        per_rank.push(seen - before);
    }
    assert_eq!(seen, rows.len(), "{what}: every input row once");
    per_rank
}

fn arrow_cast_f64(a: &ArrayRef) -> Float64Array {
    match a.as_any().downcast_ref::<Float64Array>() {
        Some(f) => f.clone(),
        None => {
            let i = a.as_any().downcast_ref::<Int64Array>().unwrap();
            i.iter().map(|x| x.map(|v| v as f64)).collect()
        }
    }
}

async fn matrix(ctxs: Vec<Context>, backend: &str) {
    let n = ctxs.len();
    for (d, data) in [Data::Uniform, Data::AllEqual, Data::Tiny]
        .into_iter()
        .enumerate()
    {
        // Timestamps for the one-ts data and, on odd rank counts, the rest.
        let ts = if d == 1 || n % 2 == 1 {
            MS
        } else {
            DataType::Int64
        };
        let (rows, span) = rows(data, seed_of(&[n as u64, d as u64]));
        // No rows, ~10 rows, several ranks' worth, everything.
        let windows: Vec<i64> = match data {
            Data::Uniform => vec![0, span * 10 / rows.len() as i64, span / 2, span * 4],
            _ => vec![0, 1, span * 4],
        };
        for w in windows {
            for closed in [Closed::Right, Closed::Both, Closed::Left, Closed::None] {
                for grouping in [Grouping::None, Grouping::Int] {
                    let what =
                        format!("{backend} {n} ranks, {data:?}, w={w}, {closed:?}, {grouping:?}");
                    run_case(&ctxs, &rows, &ts, grouping, w, closed, &what).await;
                }
            }
        }
    }
}

#[test]
fn rolling_matches_brute_force_local() {
    let rt = runtime();
    for n in RANK_COUNTS {
        rt.block_on(async {
            let ctxs = contexts(&WorldSpec::Local { nranks: n }, MemoryLimits::UNLIMITED)
                .await
                .unwrap();
            matrix(ctxs, "local").await;
        });
    }
}

#[test]
fn rolling_matches_brute_force_tcp() {
    let rt = runtime();
    for n in RANK_COUNTS {
        rt.block_on(async {
            let ctxs = tcp_contexts(n, MemoryLimits::UNLIMITED).await;
            matrix(ctxs.clone(), "tcp").await;
            shutdown_all(&ctxs).await;
        });
    }
}

#[test]
fn rolling_under_a_memory_limit_spills_and_matches() {
    let rt = runtime();
    rt.block_on(async {
        let limits = MemoryLimits {
            device: None,
            host: Some(4 << 10),
        };
        let ctxs = contexts(&WorldSpec::Local { nranks: 3 }, limits)
            .await
            .unwrap();
        let (rows, span) = rows(Data::Uniform, 99);
        run_case(
            &ctxs,
            &rows,
            &DataType::Int64,
            Grouping::None,
            span / 20,
            Closed::Right,
            "memory limit, ungrouped",
        )
        .await;
        run_case(
            &ctxs,
            &rows,
            &DataType::Int64,
            Grouping::Int,
            span / 20,
            Closed::Both,
            "memory limit, grouped",
        )
        .await;
        let spilled: u64 = ctxs.iter().map(|c| c.statistics().spilled_bytes()).sum();
        assert!(spilled > 0, "nothing spilled under a 4 KiB limit");
        // One rank: no shuffle (the sort is local), so nothing to spill;
        // the job still matches under the limit.
        let one = contexts(&WorldSpec::Local { nranks: 1 }, limits)
            .await
            .unwrap();
        run_case(
            &one,
            &rows,
            &DataType::Int64,
            Grouping::Int,
            span / 20,
            Closed::Both,
            "memory limit, grouped, one rank",
        )
        .await;
    });
}

/// Calendar windows (`1mo`, `1q`, `1mo15d`) on a microsecond timestamp
/// column, every rank count, local and tcp, every closed mode, grouped
/// and not. Half the rows fall on the last days of months (where the day
/// is clamped, and a later row's window can start before an earlier
/// row's), at several times of day, so lookback and chunk bounds are
/// tested where a row's own `t - w` would not bound its successors'.
#[test]
fn calendar_windows_match_brute_force() {
    const DAY: i64 = 86_400_000_000;
    let rt = runtime();
    let mut g = SplitMix(2024);
    // 2024-01-01 plus about half a year.
    let t0 = 19_723 * DAY;
    let rows: Vec<Row> = (0..300)
        .map(|i| {
            let day = if g.below(2) == 0 {
                let month = g.below(6) as i64;
                month * 30 + 27 + g.below(5) as i64
            } else {
                g.below(190) as i64
            };
            Row {
                id: i,
                ts: t0 + day * DAY + g.below(6) as i64 * (DAY / 6) + g.below(3) as i64,
                key: (g.below(10) != 0).then(|| g.below(3) as i64),
                v: (g.below(8) != 0).then(|| (g.below(2_000_000) as f64 - 1e6) / 1e3),
            }
        })
        .collect();
    let us = DataType::Timestamp(TimeUnit::Microsecond, None);
    let cal = |months, then| Window::Calendar {
        months,
        then,
        unit: CalendarUnit::Micros,
    };
    for n in RANK_COUNTS {
        let windows = [cal(1, 0), cal(3, 0), cal(1, 15 * DAY + 1)];
        rt.block_on(every_mode(n, &rows, &us, &windows));
    }
}

/// Days, weeks and months on a zone's local clock: rows crowded around
/// daylight-saving changes (New York's, Lord Howe's 30 minutes, Apia's
/// skipped 2011-12-30), many at local times that a step lands in a gap or
/// on a repeated hour; every rank count (each with one of the zones),
/// local and tcp, every closed mode, grouped and not.
#[test]
fn local_clock_windows_match_brute_force() {
    const H: i64 = 3_600_000_000;
    let rt = runtime();
    // (zone, instants (UTC, us) the rows crowd around)
    let zones: [(&str, [i64; 3]); 3] = [
        // 2024-03-10 07:00Z, 2024-11-03 06:00Z, 2024-04-10 06:00Z
        (
            "America/New_York",
            [1_710_054_000, 1_730_613_600, 1_712_728_800],
        ),
        // 2024-04-06 15:00Z, 2024-10-05 15:30Z, 2024-05-06 15:00Z
        (
            "Australia/Lord_Howe",
            [1_712_415_600, 1_728_142_200, 1_715_007_600],
        ),
        // 2011-12-29 10:00Z (the skipped day), 2012-03-31 14:00Z, 2012-01-29 10:00Z
        (
            "Pacific/Apia",
            [1_325_152_800, 1_333_202_400, 1_327_831_200],
        ),
    ];
    for (i, n) in RANK_COUNTS.into_iter().enumerate() {
        let (name, around) = zones[i % zones.len()];
        let zone: Zone = name.parse().unwrap();
        let mut g = SplitMix(77 + i as u64);
        let rows: Vec<Row> = (0..240)
            .map(|id| {
                // Within ~2 days of a change, at whole and half hours (the
                // hours a step lands in) plus a few microseconds.
                let c = around[g.below(3) as usize] * 1_000_000;
                let off = (g.below(200) as i64 - 100) * H / 2;
                Row {
                    id,
                    ts: c + off + (g.below(4) as i64 - 1) * (g.below(2) as i64),
                    key: (g.below(10) != 0).then(|| g.below(3) as i64),
                    v: (g.below(8) != 0).then(|| (g.below(2_000_000) as f64 - 1e6) / 1e3),
                }
            })
            .collect();
        let us = DataType::Timestamp(TimeUnit::Microsecond, Some(name.into()));
        let local = |months, weeks, days, then| Window::Zoned {
            months,
            weeks,
            days,
            then,
            unit: CalendarUnit::Micros,
            zone,
        };
        let windows = [
            local(0, 0, 1, 0),
            local(0, 1, 1, H),
            local(1, 0, 0, 0),
            local(0, 0, 2, 3 * H / 2),
        ];
        rt.block_on(every_mode(n, &rows, &us, &windows));
    }
}

/// `run_case` on `n` ranks, local and tcp, for each of `windows`, every
/// closed mode, ungrouped and grouped by the int key.
async fn every_mode(n: u32, rows: &[Row], ts: &DataType, windows: &[Window]) {
    let (local, tcp) = local_and_tcp(n).await;
    for (backend, ctxs) in [("local", &local), ("tcp", &tcp)] {
        for &w in windows {
            for closed in [Closed::Right, Closed::Both, Closed::Left, Closed::None] {
                for grouping in [Grouping::None, Grouping::Int] {
                    let what = format!("{backend} {n} ranks, {w:?}, {closed:?}, {grouping:?}");
                    run_case(ctxs, rows, ts, grouping, w, closed, &what).await;
                }
            }
        }
    }
    shutdown_all(&tcp).await;
}

/// `n` in-process ranks and `n` tcp ranks (shut the latter down after).
async fn local_and_tcp(n: u32) -> (Vec<Context>, Vec<Context>) {
    let local = contexts(&WorldSpec::Local { nranks: n }, MemoryLimits::UNLIMITED)
        .await
        .unwrap();
    (local, tcp_contexts(n, MemoryLimits::UNLIMITED).await)
}

/// Float group keys: 0.0 and -0.0 are one group, every NaN one group, as in
/// DuckDB and Polars; checked against the int keys' groups, every rank count,
/// local and tcp.
#[test]
fn float_keys_group_like_duckdb_and_polars() {
    groups_match_the_int_keys(Grouping::Float, 7, Closed::Both);
}

/// A list key with a float inside groups as the float would (0.0 with
/// -0.0, every NaN together; the row format told them apart): every rank
/// count, local and tcp.
#[test]
fn list_keys_with_floats_group_like_duckdb_and_polars() {
    groups_match_the_int_keys(Grouping::List, 9, Closed::Right);
}

/// Two group columns together, one of them float (0.0 with -0.0, every NaN
/// together): checked against the int keys' groups, every rank count,
/// local and tcp.
#[test]
fn two_group_columns_group_together() {
    groups_match_the_int_keys(Grouping::Pair, 8, Closed::Left);
}

/// `run_case` with `grouping` on uniform rows from `seed`, every rank count,
/// local and tcp: a short window closed right and a window over all the
/// data closed `wide`.
fn groups_match_the_int_keys(grouping: Grouping, seed: u64, wide: Closed) {
    let rt = runtime();
    let (rows, span) = rows(Data::Uniform, seed);
    for n in RANK_COUNTS {
        rt.block_on(async {
            let (local, tcp) = local_and_tcp(n).await;
            for (backend, ctxs) in [("local", &local), ("tcp", &tcp)] {
                for (w, closed) in [(span / 40, Closed::Right), (span * 4, wide)] {
                    let what = format!("{backend} {n} ranks, {grouping:?}, w={w}, {closed:?}");
                    let ts = DataType::Int64;
                    run_case(ctxs, &rows, &ts, grouping, w, closed, &what).await;
                }
            }
            shutdown_all(&tcp).await;
        });
    }
}

/// A group with nine in ten of the rows spreads over the ranks (the job
/// sorts by (group, ts) and fetches a group's lookback from lower ranks, as
/// ungrouped): every rank count, local and tcp, windows of ~10 rows, of a
/// few ranks' rows and over everything; each rank's output is within 1.5x
/// of an even share, and every value matches the brute force.
#[test]
fn a_large_group_spreads_over_the_ranks() {
    let rt = runtime();
    let (rows, span) = rows(Data::Skewed, 12);
    for n in RANK_COUNTS {
        rt.block_on(async {
            let (local, tcp) = local_and_tcp(n).await;
            for (backend, ctxs) in [("local", &local), ("tcp", &tcp)] {
                for (w, closed) in [
                    (span / 200, Closed::Right),
                    (span / 3, Closed::Both),
                    (span * 4, Closed::Left),
                ] {
                    let what = format!("{backend} {n} ranks, skewed, w={w}, {closed:?}");
                    let ts = DataType::Int64;
                    let per_rank =
                        run_case(ctxs, &rows, &ts, Grouping::Int, w, closed, &what).await;
                    let even = rows.len() / n as usize;
                    let most = per_rank.iter().max().copied().unwrap_or(0);
                    assert!(
                        most <= even + even / 2,
                        "{what}: rows per rank {per_rank:?} (an even share is {even})"
                    );
                }
            }
            shutdown_all(&tcp).await;
        });
    }
}

/// Order columns of other integer types and dates (read as their stored
/// integer, days for Date32), grouped and not, every rank count, local and
/// tcp; unsigned types get order values shifted to start at 0.
#[test]
fn order_columns_of_every_integer_and_date_type() {
    let rt = runtime();
    let (rows, span) = rows(Data::Uniform, 8);
    let lowest = rows.iter().map(|r| r.ts).min().unwrap();
    let shifted: Vec<Row> = rows
        .iter()
        .map(|r| Row {
            ts: r.ts - lowest,
            ..*r
        })
        .collect();
    let types = [
        (DataType::Int32, &rows),
        (DataType::Int16, &rows),
        (DataType::Date32, &rows),
        (DataType::Date64, &rows),
        (DataType::UInt16, &shifted),
        (DataType::UInt32, &shifted),
        (DataType::UInt64, &shifted),
    ];
    for n in RANK_COUNTS {
        rt.block_on(async {
            let (local, tcp) = local_and_tcp(n).await;
            for (backend, ctxs) in [("local", &local), ("tcp", &tcp)] {
                for (k, (ts, rows)) in types.iter().enumerate() {
                    let grouping = if k % 2 == 0 {
                        Grouping::Int
                    } else {
                        Grouping::None
                    };
                    let closed = [Closed::Right, Closed::Both, Closed::Left, Closed::None][k % 4];
                    let what = format!("{backend} {n} ranks, order {ts}, {grouping:?}, {closed:?}");
                    run_case(ctxs, rows, ts, grouping, span / 40, closed, &what).await;
                }
            }
            shutdown_all(&tcp).await;
        });
    }
}

/// Ranks given different jobs fail on every rank, with one message naming
/// the term and the rank, before any work: a different window (which would
/// have written inconsistent results), and an output on one rank only
/// (which hung: that rank waited in the commit the others never joined).
/// Every rank count from 2, local and tcp.
#[test]
fn ranks_given_different_jobs_fail_on_every_rank() {
    let rt = runtime();
    let schema = schema(&DataType::Int64, Grouping::None);
    let spec = RollingSpec {
        order: "ts".into(),
        by: vec![],
        values: vec!["v".into()],
        window: Window::Fixed(10),
        closed: Closed::Right,
        aggs: vec![Agg::Sum],
    };
    for n in RANK_COUNTS.into_iter().filter(|n| *n > 1) {
        rt.block_on(async {
            let (local, tcp) = local_and_tcp(n).await;
            for (backend, ctxs) in [("local", &local), ("tcp", &tcp)] {
                for case in ["window", "output"] {
                    // The last rank differs.
                    let odd = n as usize - 1;
                    let mut hs = Vec::new();
                    for (r, ctx) in ctxs.iter().enumerate() {
                        let mut spec = spec.clone();
                        let mut output = Output::Collect(CollectSink::new());
                        if r == odd && case == "window" {
                            spec.window = Window::Fixed(20);
                        }
                        if r == odd && case == "output" {
                            output = Output::Discard;
                        }
                        let job = RollingJob {
                            source: Source::Memory(schema.clone(), vec![]),
                            spec,
                            output,
                            chunk_rows: 100,
                            device: braid_nodes::job::Device::Cpu,
                        };
                        let ctx = ctx.clone();
                        hs.push(tokio::spawn(async move { job.run(ctx, None).await }));
                    }
                    let what = format!("{backend}, {n} ranks, {case}");
                    for h in hs {
                        let e = tokio::time::timeout(Duration::from_secs(30), h)
                            .await
                            .unwrap_or_else(|_| panic!("{what}: a rank hung"))
                            .unwrap()
                            .err()
                            .unwrap_or_else(|| panic!("{what}: a rank succeeded"))
                            .to_string();
                        let term = if case == "window" { "window" } else { "output" };
                        assert!(
                            e.contains("given different jobs")
                                && e.contains(&format!("({term}: "))
                                && e.contains(" on rank 0, ")
                                && e.contains(&format!(" on rank {odd});")),
                            "{what}: {e}"
                        );
                    }
                }
            }
            shutdown_all(&tcp).await;
        });
    }
}

/// A value column of the null type (pyarrow's type for a column of
/// `None`s) aggregates as any all-null column: count 0, every other
/// aggregate null, on every row; every rank count, local and tcp. (It was
/// refused as not numeric.)
#[test]
fn a_null_typed_value_column_gives_empty_windows() {
    use arrow_array::NullArray;
    let rt = runtime();
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("ts", DataType::Int64, false),
        Field::new("v", DataType::Null, true),
    ]));
    let rows = 500usize;
    for n in RANK_COUNTS {
        rt.block_on(async {
            let (local, tcp) = local_and_tcp(n).await;
            for (backend, ctxs) in [("local", &local), ("tcp", &tcp)] {
                let mut hs = Vec::new();
                let mut sinks = Vec::new();
                for (r, ctx) in ctxs.iter().enumerate() {
                    let ts: Vec<i64> = (0..rows)
                        .filter(|i| i % n as usize == r)
                        .map(|i| (i as i64 * 7919) % 1000)
                        .collect();
                    let len = ts.len();
                    let batch = RecordBatch::try_new(
                        schema.clone(),
                        vec![
                            Arc::new(Int64Array::from(ts)),
                            Arc::new(NullArray::new(len)),
                        ],
                    )
                    .unwrap();
                    let sink = CollectSink::new();
                    sinks.push(sink.clone());
                    let job = RollingJob {
                        source: Source::Memory(schema.clone(), vec![batch]),
                        spec: RollingSpec {
                            order: "ts".into(),
                            by: vec![],
                            values: vec!["v".into()],
                            window: Window::Fixed(50),
                            closed: Closed::Right,
                            aggs: AGGS.to_vec(),
                        },
                        output: Output::Collect(sink),
                        chunk_rows: 64,
                        device: braid_nodes::job::Device::Cpu,
                    };
                    let ctx = ctx.clone();
                    hs.push(tokio::spawn(async move { job.run(ctx, None).await }));
                }
                let what = format!("{backend}, {n} ranks");
                for h in hs {
                    tokio::time::timeout(Duration::from_secs(60), h)
                        .await
                        .unwrap_or_else(|_| panic!("{what}: a rank hung"))
                        .unwrap()
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                }
                let mut seen = 0;
                for b in sinks.iter().flat_map(|s| s.batches()) {
                    for agg in AGGS {
                        let c = b.column_by_name(&format!("v_{}", agg.name())).unwrap();
                        if agg == Agg::Count {
                            let c = c.as_any().downcast_ref::<Int64Array>().unwrap();
                            assert!(c.iter().all(|x| x == Some(0)), "{what}: count");
                        } else {
                            assert_eq!(c.null_count(), b.num_rows(), "{what}: {}", agg.name());
                        }
                    }
                    seen += b.num_rows();
                }
                assert_eq!(seen, rows, "{what}: every row once");
            }
            shutdown_all(&tcp).await;
        });
    }
}

/// Two jobs writing one output: while one holds it (its lock, and files in
/// its staging area), a second fails on every rank, rank 0 naming the
/// holder, and leaves the first's staging alone, also where the program
/// then abandons its own (as `rolling` does on an error). Once the first
/// lets go, the second runs and commits, removing what the first left
/// staged and its lock. Directory and one-file outputs, local and tcp.
/// (Two concurrent jobs shared the staging area: one removed the other's
/// files, and the last to finish could commit a mixed or truncated output
/// and exit 0.)
#[test]
fn a_second_job_on_one_output_fails_and_leaves_the_first_alone() {
    use braid_nodes::sink::{FileFormat, FileSink, SinkTarget};
    let rt = runtime();
    let base = std::env::temp_dir().join(format!("braid-two-jobs-{}", std::process::id()));
    let rows: Vec<Row> = (0..50)
        .map(|i| Row {
            id: i,
            ts: i * 3,
            key: Some(i % 4),
            v: Some(i as f64),
        })
        .collect();
    let schema = schema(&DataType::Int64, Grouping::None);
    let data = batch(&rows, &DataType::Int64, Grouping::None);
    let spec = RollingSpec {
        order: "ts".into(),
        by: vec![],
        values: vec!["v".into()],
        window: Window::Fixed(10),
        closed: Closed::Right,
        aggs: vec![Agg::Sum, Agg::Count],
    };
    for n in [1u32, 3] {
        for (t, target) in [
            SinkTarget::Dir(base.join(format!("d{n}"))),
            SinkTarget::File(base.join(format!("f{n}.parquet"))),
        ]
        .into_iter()
        .enumerate()
        {
            for backend in ["local", "tcp"] {
                let sink = FileSink {
                    format: FileFormat::Parquet,
                    target: target.clone(),
                    schema: schema.clone(),
                };
                let run = |ctxs: Vec<Context>| {
                    // Every rank's communicator stays open until all have
                    // ended: one dropped early reads as a dead peer.
                    let keep = ctxs.clone();
                    let hs: Vec<_> = ctxs
                        .into_iter()
                        .enumerate()
                        .map(|(r, ctx)| {
                            let job = RollingJob {
                                source: Source::Memory(
                                    schema.clone(),
                                    if r == 0 { vec![data.clone()] } else { vec![] },
                                ),
                                spec: spec.clone(),
                                output: Output::File(sink.clone()),
                                chunk_rows: 16,
                                device: braid_nodes::job::Device::Cpu,
                            };
                            tokio::spawn(async move { job.run(ctx, None).await })
                        })
                        .collect();
                    async move {
                        let mut out = Vec::new();
                        for h in hs {
                            let r = tokio::time::timeout(Duration::from_secs(30), h)
                                .await
                                .expect("a rank hung")
                                .unwrap();
                            out.push(r.map(|c| c.rows_out).map_err(|e| e.to_string()));
                        }
                        drop(keep);
                        out
                    }
                };
                let what = format!("{n} ranks, target {t}, {backend}");
                // The first job: its lock, and a file in its staging area.
                let first = sink.lock().unwrap();
                let staging = match &target {
                    SinkTarget::Dir(d) => d.join(".braid-staging"),
                    SinkTarget::File(f) => PathBuf::from(format!("{}.braid-staging", f.display())),
                };
                std::fs::create_dir_all(&staging).unwrap();
                let theirs = staging.join("part-00000.parquet");
                std::fs::write(&theirs, b"the first job's part").unwrap();
                let ctxs = |n| async move {
                    let (local, tcp) = local_and_tcp(n).await;
                    if backend == "local" { local } else { tcp }
                };
                let res = rt.block_on(async { run(ctxs(n).await).await });
                let e0 = res[0].clone().expect_err(&what);
                assert!(
                    e0.contains("another job is writing this output")
                        && e0.contains(&std::process::id().to_string()),
                    "{what}: {e0}"
                );
                for (r, x) in res.iter().enumerate() {
                    assert!(x.is_err(), "{what}: rank {r} succeeded");
                }
                sink.abandon();
                assert_eq!(
                    std::fs::read(&theirs).unwrap(),
                    b"the first job's part",
                    "{what}"
                );
                drop(first);
                let res = rt.block_on(async {
                    let c = ctxs(n).await;
                    let res = run(c.clone()).await;
                    if backend == "tcp" {
                        shutdown_all(&c).await;
                    }
                    res
                });
                let out: u64 = res
                    .into_iter()
                    .map(|x| x.unwrap_or_else(|e| panic!("{what}: {e}")))
                    .sum();
                assert_eq!(out, rows.len() as u64, "{what}");
                assert!(!staging.exists(), "{what}: the first job's staging is left");
                let lock = match &target {
                    SinkTarget::Dir(d) => d.join(".braid-lock"),
                    SinkTarget::File(f) => PathBuf::from(format!("{}.braid-lock", f.display())),
                };
                assert!(!lock.exists(), "{what}: the lock file is left");
                // Every row written, in the part files or the one file.
                let written = Source::at(target.path().to_path_buf())
                    .known_rows()
                    .unwrap();
                assert_eq!(written, Some(rows.len() as u64), "{what}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&base);
}
