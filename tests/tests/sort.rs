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

/// Asserts that the ranks' rows, in rank order, are sorted by `cmp`, and
/// that no key is split across ranks (a rank's last row is below every
/// later rank's first).
fn assert_sorted_apart<K: std::fmt::Debug>(
    per_rank: &[Vec<K>],
    cmp: impl Fn(&K, &K) -> std::cmp::Ordering,
    what: &str,
) {
    let all: Vec<&K> = per_rank.iter().flatten().collect();
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
}

/// Asserts that `got` holds the rows of `want`, each once, in any order.
fn assert_same_rows<T: Ord + std::fmt::Debug>(mut got: Vec<T>, mut want: Vec<T>, what: &str) {
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want, "{what}");
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
        assert_sorted_apart(&per_rank, cmp, &what);
        let all: Vec<&FloatKey> = per_rank.iter().flatten().collect();
        let bits = |k: &FloatKey| (k.2, k.0.map(f64::to_bits), k.1.map(f64::to_bits));
        let got: Vec<_> = all.iter().map(|k| bits(k)).collect();
        let want: Vec<_> = (0..n)
            .flat_map(|r| float_keys_of(&float_rows(seed, r)))
            .map(|k| bits(&k))
            .collect();
        assert_same_rows(
            got,
            want,
            &format!("{what}: every row once, values unchanged"),
        );
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

/// Ranks that sort by other keys, or rows with other columns, all fail
/// before any row moves, each naming itself and a rank whose call differs
/// (they returned inconsistent partitions without a word: each rank cut
/// its rows by splitters of its own keys); a key column that is missing
/// is an error that names the rank. Local and tcp.
#[test]
fn ranks_that_sort_differently_all_fail() {
    let rt = runtime();
    let by = |col: &str| {
        DistributedSort::new(vec![SortKey {
            column: col.into(),
            descending: false,
            nulls_first: false,
        }])
    };
    // Column `b` as floats: another type under the same name.
    let float_b = |r: u32, n: u32| {
        let b = rows(5, r, n);
        let f: Float64Array = b
            .column(2)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .iter()
            .map(|v| v.map(|v| v as f64))
            .collect();
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("a", DataType::Utf8, true),
            Field::new("b", DataType::Float64, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![b.column(0).clone(), b.column(1).clone(), Arc::new(f)],
        )
        .unwrap()
    };
    for n in RANK_COUNTS {
        rt.block_on(async {
            for world in ["local", "tcp"] {
                for case in ["keys", "columns", "missing"] {
                    let ctxs = match world {
                        "local" => local_ctxs(n).await,
                        _ => tcp_contexts(n, MemoryLimits::UNLIMITED).await,
                    };
                    let odd = n - 1;
                    let hs: Vec<_> = ctxs
                        .iter()
                        .map(|c| {
                            let r = c.rank();
                            let (sort, batch) = match case {
                                "keys" if r == odd => (by("a"), rows(5, r, n)),
                                "columns" if r == odd => (by("b"), float_b(r, n)),
                                "missing" => (by("nope"), rows(5, r, n)),
                                _ => (by("b"), rows(5, r, n)),
                            };
                            let c = c.clone();
                            tokio::spawn(
                                async move { sort.sort(&c, batch.schema(), vec![batch]).await },
                            )
                        })
                        .collect();
                    for (r, h) in hs.into_iter().enumerate() {
                        let r = r as u32;
                        let got = tokio::time::timeout(Duration::from_secs(60), h)
                            .await
                            .expect("hung")
                            .unwrap();
                        let what = format!("{world}, {n} ranks, {case}, rank {r}");
                        if n == 1 && case != "missing" {
                            // One rank agrees with itself.
                            assert!(got.is_ok(), "{what}: {got:?}");
                            continue;
                        }
                        let e = got.err().map(|e| e.to_string()).unwrap_or_default();
                        assert!(
                            e.starts_with(&format!("rank {r}: distributed sort: ")),
                            "{what}: {e}"
                        );
                        let peer = if r == odd { 0 } else { odd };
                        match case {
                            "keys" => assert!(
                                e.contains(&format!("call does not match rank {peer}'s"))
                                    && e.contains(&format!(
                                        "rank {peer} sorts by [\"{}\" ascending",
                                        if r == odd { "b" } else { "a" }
                                    )),
                                "{what}: {e}"
                            ),
                            "columns" => assert!(
                                e.contains(&format!("call does not match rank {peer}'s"))
                                    && e.contains(&format!(
                                        "\"b\": {}",
                                        if r == odd { "Int64" } else { "Float64" }
                                    )),
                                "{what}: {e}"
                            ),
                            _ => assert!(e.contains("no column \"nope\""), "{what}: {e}"),
                        }
                    }
                    shutdown_all(&ctxs).await;
                }
            }
        });
    }
}

/// Rank r's rows of (id, l: list<f64>, s: struct<a: f64, b: i64>): lists
/// of 0-3 values and structs over the float values that orders disagree
/// on (`float_rows`' specials), some lists null.
fn nested_rows(seed: u64, r: u32) -> RecordBatch {
    use arrow_array::builder::{Float64Builder, ListBuilder};
    use arrow_array::{ArrayRef, StructArray};
    let specials = [
        0.0,
        -0.0,
        f64::NAN,
        -f64::NAN,
        f64::from_bits(0xfff0_0000_0000_0001),
        f64::INFINITY,
        f64::NEG_INFINITY,
        1.5,
    ];
    let mut g = SplitMix(seed_of(&[seed, r as u64]));
    let count = if r % 4 == 3 {
        0
    } else {
        30 + g.below(90) as usize
    };
    let mut pick = || specials[g.below(specials.len() as u64) as usize];
    let mut lists = ListBuilder::new(Float64Builder::new());
    let mut a = Vec::with_capacity(count);
    let mut b = Vec::with_capacity(count);
    for _ in 0..count {
        if pick() == 1.5 && pick() == 1.5 {
            lists.append_null();
        } else {
            let len = (pick().to_bits() % 4) as usize;
            for _ in 0..len {
                let x = pick();
                lists.values().append_value(x);
            }
            lists.append(true);
        }
        a.push(pick());
        b.push((pick().to_bits() % 3) as i64);
    }
    let s = StructArray::from(vec![
        (
            Arc::new(Field::new("a", DataType::Float64, false)),
            Arc::new(Float64Array::from(a)) as ArrayRef,
        ),
        (
            Arc::new(Field::new("b", DataType::Int64, false)),
            Arc::new(Int64Array::from(b)) as ArrayRef,
        ),
    ]);
    let ids: Vec<i64> = (0..count).map(|i| (r as i64) << 32 | i as i64).collect();
    let (l, s): (ArrayRef, ArrayRef) = (Arc::new(lists.finish()), Arc::new(s));
    // Every rank's schema the same, whether its lists hold a null or not.
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("l", l.data_type().clone(), true),
        Field::new("s", s.data_type().clone(), false),
    ]);
    RecordBatch::try_new(
        Arc::new(schema),
        vec![Arc::new(Int64Array::from(ids)), l, s],
    )
    .unwrap()
}

/// (id, l, (s.a, s.b)) of each row.
type NestedKey = (i64, Option<Vec<f64>>, (f64, i64));

fn nested_keys_of(b: &RecordBatch) -> Vec<NestedKey> {
    use arrow_array::cast::AsArray;
    let id = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
    let l = b.column(1).as_list::<i32>();
    let s = b.column(2).as_struct();
    let sa = s.column(0).as_any().downcast_ref::<Float64Array>().unwrap();
    let sb = s.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
    (0..b.num_rows())
        .map(|i| {
            let list = (!l.is_null(i)).then(|| {
                let v = l.value(i);
                v.as_any()
                    .downcast_ref::<Float64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            });
            (id.value(i), list, (sa.value(i), sb.value(i)))
        })
        .collect()
}

/// Lists as DuckDB's `ORDER BY` and Polars' `sort` order them: element by
/// element (`float_cmp`), a prefix first; null lists last.
fn list_cmp(x: &Option<Vec<f64>>, y: &Option<Vec<f64>>) -> std::cmp::Ordering {
    use std::cmp::Ordering::*;
    match (x, y) {
        (None, None) => Equal,
        (None, Some(_)) => Greater,
        (Some(_), None) => Less,
        (Some(p), Some(q)) => p
            .iter()
            .zip(q)
            .map(|(a, b)| float_cmp(*a, *b))
            .find(|o| *o != Equal)
            .unwrap_or(p.len().cmp(&q.len())),
    }
}

/// Float values inside list and struct keys sort as DuckDB and Polars
/// sort them (-0.0 tied with 0.0, every NaN last), not in the row
/// format's IEEE total order: every rank count, local and tcp; the order
/// within and across ranks, no key split across ranks, every row once
/// with its own value bits.
#[test]
fn nested_float_keys_sort_as_duckdb_and_polars() {
    type Cmp = fn(&NestedKey, &NestedKey) -> std::cmp::Ordering;
    let orders: [(&str, Cmp); 2] = [
        ("l", |x, y| list_cmp(&x.1, &y.1)),
        ("s", |x, y| float_cmp(x.2.0, y.2.0).then(x.2.1.cmp(&y.2.1))),
    ];
    let rt = runtime();
    for n in RANK_COUNTS {
        rt.block_on(async {
            let tcp = tcp_contexts(n, MemoryLimits::UNLIMITED).await;
            for (world, ctxs) in [("local", local_ctxs(n).await), ("tcp", tcp.clone())] {
                for (k, (column, cmp)) in orders.iter().enumerate() {
                    let what = format!("{world}, {n} ranks, by {column}");
                    let seed = 71 + n as u64 * 5 + k as u64;
                    let sort = DistributedSort::new(vec![SortKey::asc(*column)]);
                    let parts = sort_all(&ctxs, &sort, |r| nested_rows(seed, r)).await;
                    let per_rank: Vec<Vec<NestedKey>> = parts.iter().map(nested_keys_of).collect();
                    assert_sorted_apart(&per_rank, cmp, &what);
                    let all: Vec<&NestedKey> = per_rank.iter().flatten().collect();
                    let bits = |k: &NestedKey| {
                        let l =
                            k.1.as_ref()
                                .map(|v| v.iter().map(|x| x.to_bits()).collect());
                        (k.0, l, k.2.0.to_bits(), k.2.1)
                    };
                    let got: Vec<(i64, Option<Vec<u64>>, u64, i64)> =
                        all.iter().map(|k| bits(k)).collect();
                    let want: Vec<_> = (0..n)
                        .flat_map(|r| nested_keys_of(&nested_rows(seed, r)))
                        .map(|k| bits(&k))
                        .collect();
                    assert_same_rows(
                        got,
                        want,
                        &format!("{what}: every row once, values unchanged"),
                    );
                }
            }
            shutdown_all(&tcp).await;
        });
    }
}

/// A hash shuffle by a list key puts the lists that group together in
/// DuckDB and Polars (`[0.0]` with `[-0.0]`, NaNs of any sign and payload
/// together) on one rank: every rank count, local and tcp; every row once.
#[test]
fn nested_float_keys_shuffle_as_they_group() {
    use braid_core::{Message, channel};
    use braid_nodes::shuffle::hash_shuffle;
    // A list's grouping form: -0.0 as 0.0, every NaN as one NaN.
    let group = |l: &Option<Vec<f64>>| {
        l.as_ref().map(|v| {
            v.iter()
                .map(|x| {
                    if x.is_nan() {
                        f64::NAN.to_bits()
                    } else {
                        (x + 0.0).to_bits()
                    }
                })
                .collect::<Vec<u64>>()
        })
    };
    let rt = runtime();
    for n in RANK_COUNTS {
        rt.block_on(async {
            let tcp = tcp_contexts(n, MemoryLimits::UNLIMITED).await;
            for (world, ctxs) in [("local", local_ctxs(n).await), ("tcp", tcp.clone())] {
                let what = format!("{world}, {n} ranks");
                let seed = 91 + n as u64;
                let hs: Vec<_> = ctxs
                    .iter()
                    .map(|c| {
                        let c = c.clone();
                        tokio::spawn(async move {
                            let b = nested_rows(seed, c.rank());
                            let (mut tx, rx) = channel(2);
                            let schema = b.schema();
                            tx.send(Message::new(0, b)).await.unwrap();
                            drop(tx);
                            hash_shuffle(&c, schema, &["l".to_string()], rx).await
                        })
                    })
                    .collect();
                let mut home = std::collections::HashMap::new();
                let mut got = Vec::new();
                for (r, h) in hs.into_iter().enumerate() {
                    let parts = tokio::time::timeout(Duration::from_secs(60), h)
                        .await
                        .expect("hung")
                        .unwrap()
                        .unwrap_or_else(|e| panic!("{what}, rank {r}: {e}"));
                    for k in parts.iter().flat_map(nested_keys_of) {
                        let at = *home.entry(group(&k.1)).or_insert(r);
                        assert_eq!(at, r, "{what}: group of {:?} on ranks {at} and {r}", k.1);
                        got.push(k.0);
                    }
                }
                let want: Vec<i64> = (0..n)
                    .flat_map(|r| nested_keys_of(&nested_rows(seed, r)))
                    .map(|k| k.0)
                    .collect();
                assert_same_rows(got, want, &format!("{what}: every row once"));
            }
            shutdown_all(&tcp).await;
        });
    }
}

/// A batch whose columns differ from the schema the sort or the shuffle
/// was given is a clear error on every rank (it panicked with an index
/// out of bounds, or would have sorted by the wrong column).
#[test]
fn a_batch_of_another_shape_is_an_error() {
    use braid_core::{Message, channel};
    use braid_nodes::shuffle::hash_shuffle;
    let rt = runtime();
    let swapped = |b: RecordBatch| b.project(&[0, 2, 1]).unwrap();
    for n in [1, 2, 3] {
        rt.block_on(async {
            let ctxs = local_ctxs(n).await;
            let hs: Vec<_> = ctxs
                .iter()
                .map(|c| {
                    let c = c.clone();
                    tokio::spawn(async move {
                        let b = rows(3, c.rank(), n);
                        let sorted = by_b().sort(&c, schema(), vec![swapped(b.clone())]).await;
                        let (mut tx, rx) = channel(2);
                        tx.send(Message::new(0, swapped(b))).await.unwrap();
                        drop(tx);
                        let shuffled = hash_shuffle(&c, schema(), &["b".to_string()], rx).await;
                        (sorted.map(|_| ()), shuffled.map(|_| ()))
                    })
                })
                .collect();
            for (r, h) in hs.into_iter().enumerate() {
                let (sorted, shuffled) = tokio::time::timeout(Duration::from_secs(60), h)
                    .await
                    .expect("hung")
                    .unwrap();
                for (what, res) in [("sort", sorted), ("shuffle", shuffled)] {
                    let e = res.err().map(|e| e.to_string()).unwrap_or_default();
                    assert!(
                        e.contains("differ from the schema's"),
                        "{n} ranks, rank {r}, {what}: {e:?}"
                    );
                }
            }
        });
    }
}

/// The public partition helpers refuse bad arguments with an error (they
/// panicked: a remainder by zero partitions, a key column or a row index
/// out of range).
#[test]
fn partition_helpers_refuse_bad_arguments() {
    use braid_nodes::partition::hash_partition;
    use braid_nodes::sort::gather_rows;
    let b = rows(4, 0, 1);
    assert!(b.num_rows() > 0);
    let e = |r: Result<usize, braid_nodes::DataError>| r.err().map(|e| e.to_string());
    let msg = e(hash_partition(&b, &[0], 0).map(|v| v.len())).unwrap_or_default();
    assert!(msg.contains("at least one partition"), "{msg:?}");
    let msg = e(hash_partition(&b, &[7], 2).map(|v| v.len())).unwrap_or_default();
    assert!(msg.contains("key column 7"), "{msg:?}");
    let past = b.num_rows() as u64;
    let msg =
        e(gather_rows(&b.schema(), std::slice::from_ref(&b), &[0, past]).map(|x| x.num_rows()))
            .unwrap_or_default();
    assert!(msg.contains("not among"), "{msg:?}");
    let msg =
        e(gather_rows(&b.schema(), std::slice::from_ref(&b), &[1 << 32]).map(|x| x.num_rows()))
            .unwrap_or_default();
    assert!(msg.contains("not among"), "{msg:?}");
    // In range: the rows as they are.
    let g = gather_rows(&b.schema(), std::slice::from_ref(&b), &[past - 1, 0]).unwrap();
    assert_eq!(g.num_rows(), 2);
    assert_eq!(g.slice(1, 1), b.slice(0, 1));
}
