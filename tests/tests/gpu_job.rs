//! The rolling job on GPUs (`Device::Gpu`) against the CPU job on the same
//! fresh random data: every closed mode, grouped and ungrouped, several
//! windows (none, a few rows, most of the data), an i32 value column next
//! to an f64 one with nulls, unsorted input spread unevenly (a rank with
//! no rows), ties in ts; N in {1, 2, 3, 4, 5, 8} ranks as threads (ranks
//! beyond the host's GPUs share them, through the host-staged transport).
//! Calendar windows (months back on timestamp and date columns) too.
//! A second test groups by a string column with nulls and carries columns
//! that have no device form (strings, a null-keyed integer group). Without
//! a GPU the tests say they skipped and pass.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{
    Array, Date32Array, Decimal128Array, Float64Array, Int32Array, Int64Array, RecordBatch,
    StringArray, TimestampMillisecondArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use braid_core::{MemoryLimits, WorldSpec};
use braid_kernels::rolling::{Agg, Closed};
use braid_kernels::{CalendarUnit, Window};
use braid_nodes::job::{Device, Output, RollingJob};
use braid_nodes::rolling::RollingSpec;
use braid_nodes::sink::CollectSink;
use braid_nodes::source::Source;
use braid_tests::SplitMix;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("ts", DataType::Int64, false),
        Field::new("key", DataType::Int64, false),
        Field::new("v", DataType::Float64, true),
        Field::new("w", DataType::Int32, false),
    ]))
}

/// Rank `r`'s share of `rows` rows of seed `seed` (ids `r mod n`; rank 1
/// of 3 or more gets none).
fn share(seed: u64, rows: usize, span: u64, r: usize, n: usize) -> RecordBatch {
    let mut g = SplitMix(seed);
    let (mut id, mut ts, mut key, mut v, mut w) = (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..rows {
        let t = g.below(span) as i64 - 1000;
        let k = g.below(7) as i64 - 3;
        let x = (g.below(10) != 0).then(|| g.below(100_000) as f64 / 8.0 - 5000.0);
        let y = g.below(2000) as i32 - 1000;
        let owner = if n > 2 && i % n == 1 { 0 } else { i % n };
        if owner == r {
            id.push(i as i64);
            ts.push(t);
            key.push(k);
            v.push(x);
            w.push(y);
        }
    }
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(id)),
            Arc::new(Int64Array::from(ts)),
            Arc::new(Int64Array::from(key)),
            Arc::new(Float64Array::from(v)),
            Arc::new(Int32Array::from(w)),
        ],
    )
    .unwrap()
}

type Out = HashMap<i64, Vec<Option<f64>>>;

/// Rank r's share of the rows of a case: (seed, rows, span, r, n).
type Make = fn(u64, usize, u64, usize, usize) -> RecordBatch;

/// Every output batch of the job on `n` ranks (as threads), each rank
/// reading its share in chunks of `chunk_rows`.
#[allow(clippy::too_many_arguments)]
fn job_batches(
    n: u32,
    device: Device,
    spec: &RollingSpec,
    make: Make,
    seed: u64,
    rows: usize,
    span: u64,
    chunk_rows: usize,
) -> Vec<RecordBatch> {
    let spec = spec.clone();
    let res = braid_core::run_world(
        &WorldSpec::Local { nranks: n },
        MemoryLimits::UNLIMITED,
        move |ctx| {
            let spec = spec.clone();
            async move {
                let r = ctx.rank() as usize;
                let sink = CollectSink::new();
                let part = make(seed, rows, span, r, n as usize);
                let job = RollingJob {
                    source: Source::Memory(part.schema(), vec![part]),
                    spec,
                    output: Output::Collect(sink.clone()),
                    chunk_rows,
                    device,
                };
                job.check()?;
                job.run(ctx, None).await?;
                Ok(sink.batches())
            }
        },
    )
    .unwrap_or_else(|e| panic!("{device:?}, {n} ranks: {e}"));
    res.into_iter().flat_map(|(_, b)| b).collect()
}

/// The job's aggregate columns as f64 per row id.
fn run(
    n: u32,
    device: Device,
    spec: &RollingSpec,
    make: Make,
    seed: u64,
    rows: usize,
    span: u64,
) -> Out {
    let first = make(0, 0, 1, 0, 1).num_columns();
    aggregates(
        &job_batches(n, device, spec, make, seed, rows, span, 1000),
        first,
    )
}

/// The aggregate columns (from column `first` on) as f64 per row id.
fn aggregates(batches: &[RecordBatch], first: usize) -> Out {
    let mut out = Out::new();
    for b in batches {
        let ids = b
            .column_by_name("id")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .clone();
        for i in 0..b.num_rows() {
            let vals = (first..b.num_columns())
                .map(|c| {
                    let a = arrow_cast::cast(b.column(c), &DataType::Float64).unwrap();
                    let a = a.as_any().downcast_ref::<Float64Array>().unwrap().clone();
                    (!a.is_null(i)).then(|| a.value(i))
                })
                .collect();
            assert!(
                out.insert(ids.value(i), vals).is_none(),
                "row {} twice",
                ids.value(i)
            );
        }
    }
    out
}

fn counts() -> Vec<u32> {
    braid_tests::gpu_suite::rank_counts("gpu job test")
}

#[test]
fn gpu_job_equals_cpu_job() {
    let mut g = SplitMix(braid_tests::fresh_seed());
    for n in counts() {
        for grouped in [false, true] {
            for closed in [Closed::Right, Closed::Both, Closed::Left, Closed::None] {
                for (rows, span, window) in [
                    (20_000usize, 50_000u64, 40i64),
                    (3_000, 200, 0),
                    (5_000, 3_000, 100_000),
                    (200, 1, 5),
                ] {
                    let seed = g.next_u64();
                    let spec = RollingSpec {
                        order: "ts".into(),
                        by: grouped.then(|| "key".to_string()).into_iter().collect(),
                        values: vec!["v".into(), "w".into()],
                        window: window.into(),
                        closed,
                        aggs: Agg::ALL.to_vec(),
                    };
                    let what = format!(
                        "{n} GPUs, grouped {grouped}, {closed:?}, {rows} rows over {span}, window {window}, seed {seed}"
                    );
                    gpu_equals_cpu(&what, n, &spec, share, seed, rows, span);
                }
            }
        }
        eprintln!("gpu job = cpu job on {n} GPUs");
    }
}

/// Runs the case on both devices and checks the GPU job's rows equal the
/// CPU job's.
fn gpu_equals_cpu(
    what: &str,
    n: u32,
    spec: &RollingSpec,
    make: Make,
    seed: u64,
    rows: usize,
    span: u64,
) {
    let cpu = run(n, Device::Cpu, spec, make, seed, rows, span);
    let gpu = run(n, Device::Gpu, spec, make, seed, rows, span);
    assert_same(what, rows, &cpu, &gpu);
}

/// The GPU job's rows equal the CPU job's, value by value.
fn assert_same(what: &str, rows: usize, cpu: &Out, gpu: &Out) {
    assert_eq!(cpu.len(), rows, "{what}: cpu rows");
    assert_eq!(gpu.len(), rows, "{what}: gpu rows");
    for (id, want) in cpu {
        let got = &gpu[id];
        assert_eq!(got.len(), want.len(), "{what}: row {id}: columns");
        for (c, (a, b)) in got.iter().zip(want).enumerate() {
            match (a, b) {
                (None, None) => {}
                (Some(x), Some(y)) if (x - y).abs() <= 1e-9 * (1.0 + y.abs()) => {}
                _ => panic!("{what}: row {id} column {c}: gpu {a:?}, cpu {b:?}"),
            }
        }
    }
}

/// Rank r's share of a table with columns the device cannot hold: a
/// string group column with nulls (`sym`), a string passenger (`note`,
/// checked for every row), an i32 group column with nulls (`k32`), a
/// float group column with 0.0 and -0.0, NaNs and nulls (`fk`), a decimal
/// value column (`dec`); the order column is i32.
fn share_strings(seed: u64, rows: usize, span: u64, r: usize, n: usize) -> RecordBatch {
    let mut g = SplitMix(seed);
    let (mut id, mut ts, mut sym, mut note, mut k32, mut v) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut fk, mut dec) = (vec![], vec![]);
    for i in 0..rows {
        let t = g.below(span) as i32 - 500;
        let s = match g.below(9) {
            0 => None,
            k => Some(format!("s{}", "x".repeat(k as usize))),
        };
        let k = (g.below(6) != 0).then(|| g.below(5) as i32 - 2);
        let x = (g.below(8) != 0).then(|| g.below(10_000) as f64 / 4.0 - 1000.0);
        let f = match g.below(7) {
            0 => None,
            1 => Some(-0.0),
            2 => Some(0.0),
            3 => Some(f64::NAN),
            4 => Some(-f64::NAN),
            k => Some(k as f64 + 0.5),
        };
        let d = (g.below(5) != 0).then(|| g.below(2_000_000) as i128 - 1_000_000);
        if i % n == r {
            fk.push(f);
            dec.push(d);
            id.push(i as i64);
            ts.push(t);
            sym.push(s);
            note.push((i % 3 != 0).then(|| format!("row {i}")));
            k32.push(k);
            v.push(x);
        }
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("ts", DataType::Int32, false),
        Field::new("sym", DataType::Utf8, true),
        Field::new("note", DataType::Utf8, true),
        Field::new("k32", DataType::Int32, true),
        Field::new("v", DataType::Float64, true),
        Field::new("fk", DataType::Float64, true),
        Field::new("dec", DataType::Decimal128(12, 3), true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(id)),
            Arc::new(Int32Array::from(ts)),
            Arc::new(StringArray::from(sym)),
            Arc::new(StringArray::from(note)),
            Arc::new(Int32Array::from(k32)),
            Arc::new(Float64Array::from(v)),
            Arc::new(Float64Array::from(fk)),
            Arc::new(
                Decimal128Array::from(dec)
                    .with_precision_and_scale(12, 3)
                    .unwrap(),
            ),
        ],
    )
    .unwrap()
}

/// Every row's string passenger (`note`) as the job wrote it, by id.
fn notes(batches: &[RecordBatch]) -> HashMap<i64, Option<String>> {
    let mut out = HashMap::new();
    for b in batches {
        let ids = b
            .column_by_name("id")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .clone();
        let note = b
            .column_by_name("note")
            .unwrap()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .clone();
        for i in 0..b.num_rows() {
            out.insert(
                ids.value(i),
                (!note.is_null(i)).then(|| note.value(i).to_string()),
            );
        }
    }
    out
}

#[test]
fn gpu_job_groups_by_strings_and_keeps_host_columns() {
    let mut g = SplitMix(braid_tests::fresh_seed());
    for n in counts() {
        let groupings: [&[&str]; 5] = [&[], &["sym"], &["k32"], &["fk"], &["sym", "fk"]];
        for by in groupings {
            for closed in [Closed::Right, Closed::Both, Closed::Left, Closed::None] {
                for (rows, span, window) in
                    [(12_000usize, 20_000u64, 60i64), (500, 40, 7), (0, 1, 5)]
                {
                    let seed = g.next_u64();
                    let spec = RollingSpec {
                        order: "ts".into(),
                        by: by.iter().map(|b| b.to_string()).collect(),
                        values: vec!["v".into(), "dec".into()],
                        window: window.into(),
                        closed,
                        aggs: Agg::ALL.to_vec(),
                    };
                    let what = format!(
                        "{n} GPUs, by {by:?}, {closed:?}, {rows} rows over {span}, window {window}, seed {seed}"
                    );
                    let cpu = run(n, Device::Cpu, &spec, share_strings, seed, rows, span);
                    let batches =
                        job_batches(n, Device::Gpu, &spec, share_strings, seed, rows, span, 777);
                    let first = share_strings(0, 0, 1, 0, 1).num_columns();
                    assert_same(&what, rows, &cpu, &aggregates(&batches, first));
                    let want: HashMap<i64, Option<String>> = (0..rows as i64)
                        .map(|i| (i, (i % 3 != 0).then(|| format!("row {i}"))))
                        .collect();
                    assert_eq!(notes(&batches), want, "{what}: notes");
                }
            }
        }
        eprintln!("gpu job with string and null-keyed groups = cpu job on {n} GPUs");
    }
}

/// Rank r's share of rows dated over `span` days from 2023-01-01, half of
/// them on the 28th to the 31st of a month (where a month back clamps),
/// the order column a millisecond timestamp (`share_ms`) or a date
/// (`share_days`).
fn share_dated(
    seed: u64,
    rows: usize,
    span: u64,
    r: usize,
    n: usize,
    order: DataType,
) -> RecordBatch {
    let mut g = SplitMix(seed);
    let (mut id, mut ts, mut key, mut v) = (vec![], vec![], vec![], vec![]);
    for i in 0..rows {
        let mut day = 19_358 + g.below(span) as i64;
        if g.below(2) == 0 {
            day = braid_tests::toward_month_end(day, g.below(4) as i64);
        }
        let t = match order {
            DataType::Date32 => day,
            _ => day * 86_400_000 + g.below(86_400_000) as i64,
        };
        let k = g.below(5) as i64;
        let x = (g.below(10) != 0).then(|| g.below(100_000) as f64 / 8.0 - 5000.0);
        let owner = if n > 2 && i % n == 1 { 0 } else { i % n };
        if owner == r {
            id.push(i as i64);
            ts.push(t);
            key.push(k);
            v.push(x);
        }
    }
    let ts: Arc<dyn Array> = match order {
        DataType::Date32 => Arc::new(Date32Array::from(
            ts.iter().map(|&d| d as i32).collect::<Vec<_>>(),
        )),
        _ => Arc::new(TimestampMillisecondArray::from(ts)),
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("ts", ts.data_type().clone(), false),
        Field::new("key", DataType::Int64, false),
        Field::new("v", DataType::Float64, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(id)),
            ts,
            Arc::new(Int64Array::from(key)),
            Arc::new(Float64Array::from(v)),
        ],
    )
    .unwrap()
}

fn share_ms(seed: u64, rows: usize, span: u64, r: usize, n: usize) -> RecordBatch {
    share_dated(
        seed,
        rows,
        span,
        r,
        n,
        DataType::Timestamp(TimeUnit::Millisecond, None),
    )
}

fn share_days(seed: u64, rows: usize, span: u64, r: usize, n: usize) -> RecordBatch {
    share_dated(seed, rows, span, r, n, DataType::Date32)
}

#[test]
fn gpu_job_calendar_windows_equal_cpu_job() {
    let mut g = SplitMix(braid_tests::fresh_seed());
    for n in counts() {
        for grouped in [false, true] {
            for closed in [Closed::Right, Closed::Both, Closed::Left, Closed::None] {
                for (make, unit, rows, span, months, then) in [
                    (
                        share_ms as Make,
                        CalendarUnit::Millis,
                        20_000usize,
                        900u64,
                        1u32,
                        0i64,
                    ),
                    (share_days, CalendarUnit::Days, 6_000, 2_000, 3, 15),
                    (share_ms, CalendarUnit::Millis, 3_000, 40, 1, 86_400_000),
                ] {
                    let seed = g.next_u64();
                    let window = Window::Calendar { months, then, unit };
                    let spec = RollingSpec {
                        order: "ts".into(),
                        by: grouped.then(|| "key".to_string()).into_iter().collect(),
                        values: vec!["v".into()],
                        window,
                        closed,
                        aggs: Agg::ALL.to_vec(),
                    };
                    let what = format!(
                        "{n} GPUs, grouped {grouped}, {closed:?}, {rows} rows over {span} days, {window:?}, seed {seed}"
                    );
                    gpu_equals_cpu(&what, n, &spec, make, seed, rows, span);
                }
            }
        }
        eprintln!("gpu job = cpu job with calendar windows on {n} GPUs");
    }
}

/// A window on a zone's local clock needs the zone database, which the
/// kernels lack: the GPU job refuses it before any work (no GPU needed to
/// check), naming the zone, and the CPU job takes it.
#[test]
fn gpu_job_refuses_local_clock_windows_by_name() {
    let ts = DataType::Timestamp(TimeUnit::Millisecond, Some("America/New_York".into()));
    let schema = Arc::new(Schema::new(vec![
        Field::new("ts", ts, false),
        Field::new("v", DataType::Float64, true),
    ]));
    let spec = RollingSpec {
        order: "ts".into(),
        by: Vec::new(),
        values: vec!["v".into()],
        window: Window::Zoned {
            months: 0,
            weeks: 0,
            days: 1,
            then: 0,
            unit: CalendarUnit::Millis,
            zone: "America/New_York".parse().unwrap(),
        },
        closed: Closed::Right,
        aggs: vec![Agg::Sum],
    };
    let job = |device| RollingJob {
        source: Source::Memory(schema.clone(), vec![]),
        spec: spec.clone(),
        output: Output::Collect(CollectSink::new()),
        chunk_rows: 1000,
        device,
    };
    let e = job(Device::Gpu).check().unwrap_err().to_string();
    assert!(
        e.contains("America/New_York") && e.contains("CPU only"),
        "{e}"
    );
    job(Device::Cpu).check().unwrap();
}
