//! Distributed sort against a local reference: every rank count, local and
//! tcp; two keys (one descending, nulls first), many ties. Checks the global
//! order (within and across ranks), that no key is split across ranks, and
//! that every row arrives exactly once.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail by panicking

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Array, Float32Array, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use braid_core::world::contexts;
use braid_core::{Context, MemoryLimits, WorldSpec};
use braid_nodes::sort::{DistributedSort, SortKey};
use braid_tests::{RANK_COUNTS, SplitMix, runtime, seed_of, shutdown_all, tcp_contexts};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("a", DataType::Utf8, true),
        Field::new("b", DataType::Int64, true),
    ]))
}

/// Rank r's rows: (id, a, b) with few distinct values and nulls.
fn rows(seed: u64, r: u32, n: u32) -> RecordBatch {
    let mut g = SplitMix(seed_of(&[seed, r as u64]));
    let count = if r % 3 == 1 {
        0
    } else {
        50 + g.below(150) as usize
    };
    let ids: Vec<i64> = (0..count).map(|i| (r as i64) << 32 | i as i64).collect();
    let a: Vec<Option<String>> = (0..count)
        .map(|_| {
            if g.below(7) == 0 {
                None
            } else {
                Some(format!("k{}", g.below(5)))
            }
        })
        .collect();
    let b: Vec<Option<i64>> = (0..count)
        .map(|_| {
            if g.below(9) == 0 {
                None
            } else {
                Some(g.below(20) as i64 - 10)
            }
        })
        .collect();
    let _ = n;
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(ids)),
            Arc::new(StringArray::from(a)),
            Arc::new(Int64Array::from(b)),
        ],
    )
    .unwrap()
}

type Key = (Option<String>, Option<i64>);

fn keys_of(b: &RecordBatch) -> Vec<(Key, i64)> {
    let id = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
    let a = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
    let bb = b.column(2).as_any().downcast_ref::<Int64Array>().unwrap();
    (0..b.num_rows())
        .map(|i| {
            let ka = (!a.is_null(i)).then(|| a.value(i).to_string());
            let kb = (!bb.is_null(i)).then(|| bb.value(i));
            ((ka, kb), id.value(i))
        })
        .collect()
}

/// The order: a ascending with nulls last, then b descending with nulls first.
fn cmp(x: &Key, y: &Key) -> std::cmp::Ordering {
    let oa = match (&x.0, &y.0) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (Some(_), None) => std::cmp::Ordering::Less,
        (Some(p), Some(q)) => p.cmp(q),
    };
    oa.then(match (x.1, y.1) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) => std::cmp::Ordering::Less,
        (Some(_), None) => std::cmp::Ordering::Greater,
        (Some(p), Some(q)) => q.cmp(&p),
    })
}

/// Runs `sort` on every rank of `ctxs` with `input(rank)` as its table;
/// each rank's sorted part, in rank order (a rank that fails, or takes
/// over 60 s, fails the test).
async fn sort_all(
    ctxs: &[Context],
    sort: &DistributedSort,
    input: impl Fn(u32) -> RecordBatch,
) -> Vec<RecordBatch> {
    try_sort_all(ctxs, sort, input)
        .await
        .into_iter()
        .enumerate()
        .map(|(r, b)| b.unwrap_or_else(|e| panic!("rank {r}: {e}")))
        .collect()
}

/// [`sort_all`], each rank's outcome as it is (a rank that takes over
/// 60 s still fails the test).
async fn try_sort_all(
    ctxs: &[Context],
    sort: &DistributedSort,
    input: impl Fn(u32) -> RecordBatch,
) -> Vec<Result<RecordBatch, String>> {
    let hs: Vec<_> = ctxs
        .iter()
        .map(|c| {
            let (c, s, b) = (c.clone(), sort.clone(), input(c.rank()));
            tokio::spawn(async move { s.sort(&c, b.schema(), vec![b]).await })
        })
        .collect();
    let mut parts = Vec::new();
    for h in hs {
        let b = tokio::time::timeout(Duration::from_secs(60), h)
            .await
            .expect("hung")
            .unwrap();
        parts.push(b.map_err(|e| e.to_string()));
    }
    parts
}

/// `n` in-process ranks.
async fn local_ctxs(n: u32) -> Vec<Context> {
    contexts(&WorldSpec::Local { nranks: n }, MemoryLimits::UNLIMITED)
        .await
        .unwrap()
}

/// A sort by column `b`, ascending.
fn by_b() -> DistributedSort {
    DistributedSort::new(vec![SortKey {
        column: "b".into(),
        descending: false,
        nulls_first: false,
    }])
}

async fn check(ctxs: Vec<Context>, seed: u64, samples_per_rank: usize) {
    let n = ctxs.len() as u32;
    let mut sort = DistributedSort::new(vec![
        SortKey {
            column: "a".into(),
            descending: false,
            nulls_first: false,
        },
        SortKey {
            column: "b".into(),
            descending: true,
            nulls_first: true,
        },
    ]);
    sort.samples_per_rank = samples_per_rank;
    let per_rank: Vec<_> = sort_all(&ctxs, &sort, |r| rows(seed, r, n))
        .await
        .iter()
        .map(keys_of)
        .collect();
    let mut all: Vec<(Key, i64)> = per_rank.iter().flatten().cloned().collect();
    for w in all.windows(2) {
        assert_ne!(
            cmp(&w[0].0, &w[1].0),
            std::cmp::Ordering::Greater,
            "{n} ranks: out of order: {:?} before {:?}",
            w[0],
            w[1]
        );
    }
    for r in 0..per_rank.len() {
        for s in r + 1..per_rank.len() {
            if let (Some(last), Some(first)) = (per_rank[r].last(), per_rank[s].first()) {
                assert_ne!(
                    cmp(&last.0, &first.0),
                    std::cmp::Ordering::Equal,
                    "{n} ranks: key {:?} split across ranks {r} and {s}",
                    last.0
                );
            }
        }
    }
    let mut got: Vec<i64> = all.drain(..).map(|x| x.1).collect();
    got.sort_unstable();
    let mut want: Vec<i64> = (0..n)
        .flat_map(|r| keys_of(&rows(seed, r, n)).into_iter().map(|x| x.1))
        .collect();
    want.sort_unstable();
    assert_eq!(got, want, "{n} ranks: every row exactly once");
}

#[test]
fn distributed_sort_orders_globally_local() {
    let rt = runtime();
    for n in RANK_COUNTS {
        rt.block_on(async {
            let ctxs = local_ctxs(n).await;
            check(ctxs, 3 + n as u64, 1024).await;
        });
    }
}

#[test]
fn distributed_sort_orders_globally_tcp() {
    let rt = runtime();
    for n in RANK_COUNTS {
        rt.block_on(async {
            let ctxs = tcp_contexts(n, MemoryLimits::UNLIMITED).await;
            check(ctxs.clone(), 9 + n as u64, 1024).await;
            shutdown_all(&ctxs).await;
        });
    }
}

/// A table without rows, each rank holding an empty batch, sorts into
/// empty partitions (ranks above 0 failed: no samples, so no splitters to
/// cut even an empty batch into a part a rank); and a sort asked for no
/// samples still takes one a rank and orders globally.
#[test]
fn empty_tables_and_zero_samples_sort() {
    let rt = runtime();
    for n in RANK_COUNTS {
        rt.block_on(async {
            let ctxs = local_ctxs(n).await;
            let parts = sort_all(&ctxs, &by_b(), |_| RecordBatch::new_empty(schema())).await;
            for (r, b) in parts.iter().enumerate() {
                assert_eq!(b.num_rows(), 0, "{n} ranks, rank {r}");
            }
            check(ctxs, 21 + n as u64, 0).await;
        });
    }
}

/// Ranks of very different sizes over key ranges of their own (rank 0:
/// 100,000 rows, the others 1,000 each) still get ranges of about equal
/// rows: samples stand for their rank's rows. With every sample weighed
/// the same, each small rank took a share of the key space, and rank 0's
/// range held nearly all rows.
#[test]
fn uneven_ranks_get_even_ranges() {
    let rt = runtime();
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        rt.block_on(async {
            let ctxs = local_ctxs(n).await;
            let input = |r: u32| {
                let (lo, len) = if r == 0 {
                    (0i64, 100_000i64)
                } else {
                    (1_000_000 * r as i64, 1_000)
                };
                let ids: Vec<i64> = (lo..lo + len).collect();
                RecordBatch::try_new(
                    schema(),
                    vec![
                        Arc::new(Int64Array::from(ids.clone())),
                        Arc::new(StringArray::from(vec!["x"; len as usize])),
                        Arc::new(Int64Array::from(ids)),
                    ],
                )
                .unwrap()
            };
            let sizes: Vec<usize> = sort_all(&ctxs, &by_b(), input)
                .await
                .iter()
                .map(RecordBatch::num_rows)
                .collect();
            let total: usize = sizes.iter().sum();
            assert_eq!(
                total,
                100_000 + 1_000 * (n as usize - 1),
                "{n} ranks: rows lost"
            );
            let even = total / n as usize;
            assert!(
                sizes.iter().all(|s| *s <= even + even / 2),
                "{n} ranks: ranges of {sizes:?} rows, {even} each would be even"
            );
        });
    }
}

/// A float value as DuckDB and Polars sort it: by value, -0.0 equal to
/// 0.0, every NaN (of any sign or payload) equal and above +inf.
fn float_cmp(x: f64, y: f64) -> std::cmp::Ordering {
    match (x.is_nan(), y.is_nan()) {
        (true, true) => std::cmp::Ordering::Equal,
        (true, false) => std::cmp::Ordering::Greater,
        (false, true) => std::cmp::Ordering::Less,
        _ => x.partial_cmp(&y).unwrap(),
    }
}

/// Rank r's rows of (id, f: f64, g: f32) over the values that orders
/// disagree on: both zeros, NaNs with the sign bit set (what x86 arithmetic
/// makes) or a payload, infinities, subnormals; with nulls.
fn float_rows(seed: u64, r: u32) -> RecordBatch {
    let specials = [
        0.0,
        -0.0,
        f64::NAN,
        -f64::NAN,
        f64::from_bits(0xfff0_0000_0000_0001),
        f64::INFINITY,
        f64::NEG_INFINITY,
        5e-324,
        -5e-324,
        1.5,
        -1.5,
    ];
    let mut g = SplitMix(seed_of(&[seed, r as u64]));
    let count = 40 + g.below(120) as usize;
    let mut pick = || (g.below(10) != 0).then(|| specials[g.below(specials.len() as u64) as usize]);
    let f: Vec<Option<f64>> = (0..count).map(|_| pick()).collect();
    let h: Vec<Option<f32>> = (0..count).map(|_| pick().map(|x| x as f32)).collect();
    let ids: Vec<i64> = (0..count).map(|i| (r as i64) << 32 | i as i64).collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("f", DataType::Float64, true),
        Field::new("g", DataType::Float32, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ids)),
            Arc::new(Float64Array::from(f)),
            Arc::new(Float32Array::from(h)),
        ],
    )
    .unwrap()
}

type FloatKey = (Option<f64>, Option<f64>, i64);

fn float_keys_of(b: &RecordBatch) -> Vec<FloatKey> {
    let id = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
    let f = b.column(1).as_any().downcast_ref::<Float64Array>().unwrap();
    let h = b.column(2).as_any().downcast_ref::<Float32Array>().unwrap();
    (0..b.num_rows())
        .map(|i| {
            let kf = (!f.is_null(i)).then(|| f.value(i));
            let kh = (!h.is_null(i)).then(|| h.value(i) as f64);
            (kf, kh, id.value(i))
        })
        .collect()
}

/// Float sort keys order as DuckDB's `ORDER BY` and Polars' `sort` do
/// (Arrow's IEEE total order put NaNs with the sign bit first and -0.0
/// before 0.0, and could put -0.0 and 0.0 on different ranks): one key (f
/// ascending, nulls last: Arrow's sort kernel) and two (g descending with
/// nulls first, then f ascending: the row format), every rank count, local
/// and tcp. Checks the order within and across ranks, that no key is split
/// across ranks, that every row arrives once with its own value bits.
#[test]
fn float_keys_sort_as_duckdb_and_polars() {
    let rt = runtime();
    for n in RANK_COUNTS {
        rt.block_on(async {
            check_float_orders(&local_ctxs(n).await, &format!("local, {n} ranks")).await;
            let ctxs = tcp_contexts(n, MemoryLimits::UNLIMITED).await;
            check_float_orders(&ctxs, &format!("tcp, {n} ranks")).await;
            shutdown_all(&ctxs).await;
        });
    }
}

/// One value of a nullable float key against another, ascending
/// (`float_cmp`), nulls last or first.
fn opt_cmp(x: Option<f64>, y: Option<f64>, nulls_first: bool) -> std::cmp::Ordering {
    use std::cmp::Ordering::*;
    match (x, y) {
        (None, None) => Equal,
        (None, Some(_)) => {
            if nulls_first {
                Less
            } else {
                Greater
            }
        }
        (Some(_), None) => {
            if nulls_first {
                Greater
            } else {
                Less
            }
        }
        (Some(p), Some(q)) => float_cmp(p, q),
    }
}

async fn check_float_orders(ctxs: &[Context], world: &str) {
    let key = |column: &str, descending: bool, nulls_first: bool| SortKey {
        column: column.into(),
        descending,
        nulls_first,
    };
    type Cmp = fn(&FloatKey, &FloatKey) -> std::cmp::Ordering;
    let orders: [(DistributedSort, Cmp); 2] = [
        (
            DistributedSort::new(vec![key("f", false, false)]),
            |x, y| opt_cmp(x.0, y.0, false),
        ),
        (
            DistributedSort::new(vec![key("g", true, true), key("f", false, false)]),
            // g descending with nulls first: g reversed, nulls last reversed.
            |x, y| opt_cmp(y.1, x.1, false).then(opt_cmp(x.0, y.0, false)),
        ),
    ];
    let n = ctxs.len() as u32;
    for (k, (sort, cmp)) in orders.iter().enumerate() {
        let seed = 31 + n as u64 * 7 + k as u64;
        let what = format!("{world}, order {k}");
        let parts = sort_all(ctxs, sort, |r| float_rows(seed, r)).await;
        let per_rank: Vec<Vec<FloatKey>> = parts.iter().map(float_keys_of).collect();
        let all: Vec<&FloatKey> = per_rank.iter().flatten().collect();
        for w in all.windows(2) {
            assert_ne!(
                cmp(w[0], w[1]),
                std::cmp::Ordering::Greater,
                "{what}: {:?} before {:?}",
                w[0],
                w[1]
            );
        }
        for r in 1..per_rank.len() {
            for s in 0..r {
                if let (Some(last), Some(first)) = (per_rank[s].last(), per_rank[r].first()) {
                    assert_eq!(
                        cmp(last, first),
                        std::cmp::Ordering::Less,
                        "{what}: key of {last:?} split across ranks {s} and {r}"
                    );
                }
            }
        }
        let bits = |k: &FloatKey| (k.2, k.0.map(f64::to_bits), k.1.map(f64::to_bits));
        let mut got: Vec<_> = all.iter().map(|k| bits(k)).collect();
        let mut want: Vec<_> = (0..n)
            .flat_map(|r| float_keys_of(&float_rows(seed, r)))
            .map(|k| bits(&k))
            .collect();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want, "{what}: every row once, values unchanged");
    }
}

/// A sort by no keys is a clear error on every rank (it panicked: the row
/// format of no columns has no rows to sample).
#[test]
fn a_sort_without_keys_is_an_error() {
    let rt = runtime();
    for n in RANK_COUNTS {
        rt.block_on(async {
            let ctxs = local_ctxs(n).await;
            let res = try_sort_all(&ctxs, &DistributedSort::new(vec![]), |r| rows(5, r, n)).await;
            for (r, x) in res.into_iter().enumerate() {
                let e = x.err().unwrap_or_default();
                assert!(e.contains("at least one key"), "{n} ranks, rank {r}: {e:?}");
            }
        });
    }
}
