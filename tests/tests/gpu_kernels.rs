//! GPU kernels (feature `cuda`) against CPU references on fresh random
//! data, with every device allocation poisoned (`BRAID_POISON_DEVICE`), at
//! sizes around and off the block and tile sizes. Without a GPU the tests
//! say they skipped and pass.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use braid_core::cuda::{DeviceBuffer, Gpu};
use braid_kernels::gpu::{
    NumType, RollingInput, cast_to_f64, cast_to_i64, gather, hash_partition, lower_bound,
    order_key_f64, order_key_i64, radix_sort, rolling,
};
use braid_kernels::rolling::{Agg, Closed, Segments, rolling as cpu_rolling, rolling_segments};
use braid_kernels::{CalendarUnit, Window};
use braid_tests::SplitMix;

const SIZES: [usize; 9] = [0, 1, 2, 255, 257, 4095, 4097, 100_003, 3_000_001];

fn gpu() -> Option<Arc<Gpu>> {
    if Gpu::count() == 0 {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "gpu kernel tests skipped: no CUDA device on this host"
        );
        return None;
    }
    braid_core::cuda::poison_new_allocations(true);
    Some(Gpu::for_rank(0).unwrap())
}

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

#[test]
fn gather_matches_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut g = SplitMix(braid_tests::fresh_seed());
    for &n in &SIZES {
        let m = n.max(1) * 2 + 3;
        let idx: Vec<u32> = (0..n).map(|_| g.below(m as u64) as u32).collect();
        let d_idx = DeviceBuffer::from_slice(&gpu, &idx).unwrap();
        let v8: Vec<u64> = (0..m).map(|_| g.next_u64()).collect();
        let got: Vec<u64> = gather(
            &gpu,
            &DeviceBuffer::from_slice(&gpu, &v8).unwrap(),
            8,
            &d_idx,
        )
        .unwrap()
        .to_vec()
        .unwrap();
        let want: Vec<u64> = idx.iter().map(|&i| v8[i as usize]).collect();
        assert_eq!(got, want, "gather u64, n = {n}");
        let v4: Vec<u32> = (0..m).map(|_| g.next_u64() as u32).collect();
        let got: Vec<u32> = gather(
            &gpu,
            &DeviceBuffer::from_slice(&gpu, &v4).unwrap(),
            4,
            &d_idx,
        )
        .unwrap()
        .to_vec()
        .unwrap();
        let want: Vec<u32> = idx.iter().map(|&i| v4[i as usize]).collect();
        assert_eq!(got, want, "gather u32, n = {n}");
        let v1: Vec<u8> = (0..m).map(|_| g.next_u64() as u8).collect();
        let got = gather(
            &gpu,
            &DeviceBuffer::from_host(&gpu, &v1).unwrap(),
            1,
            &d_idx,
        )
        .unwrap()
        .to_host()
        .unwrap();
        let want: Vec<u8> = idx.iter().map(|&i| v1[i as usize]).collect();
        assert_eq!(got, want, "gather u8, n = {n}");
    }
}

#[test]
fn hash_partition_matches_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut g = SplitMix(braid_tests::fresh_seed());
    for &n in &SIZES {
        for nparts in [1u32, 2, 3, 8, 1000] {
            let keys: Vec<i64> = (0..n)
                .map(|_| g.next_u64() as i64 >> (g.below(60)))
                .collect();
            let (part, counts) = hash_partition(
                &gpu,
                &DeviceBuffer::from_slice(&gpu, &keys).unwrap(),
                nparts,
            )
            .unwrap();
            let part: Vec<u32> = part.to_vec().unwrap();
            let counts: Vec<u32> = counts.to_vec().unwrap();
            let want: Vec<u32> = keys
                .iter()
                .map(|&k| (mix64(k as u64) % nparts as u64) as u32)
                .collect();
            assert_eq!(part, want, "partition ids, n = {n}, {nparts} parts");
            let mut wc = vec![0u32; nparts as usize];
            for &p in &want {
                wc[p as usize] += 1;
            }
            assert_eq!(counts, wc, "counts, n = {n}, {nparts} parts");
        }
    }
}

/// Sorts `keys` on the GPU with the identity payload; checks the keys come
/// out in order and the payload is the stable sorting permutation.
fn check_sort(gpu: &Arc<Gpu>, keys: DeviceBuffer, host_order: &[u64], what: &str) {
    let n = host_order.len();
    let perm: Vec<u32> = (0..n as u32).collect();
    let (sorted, p) = radix_sort(gpu, keys, DeviceBuffer::from_slice(gpu, &perm).unwrap()).unwrap();
    let sorted: Vec<u64> = sorted.to_vec().unwrap();
    let p: Vec<u32> = p.to_vec().unwrap();
    let mut want: Vec<u32> = (0..n as u32).collect();
    want.sort_by_key(|&i| host_order[i as usize]); // stable
    assert_eq!(p, want, "{what}: permutation (n = {n})");
    let want_keys: Vec<u64> = want.iter().map(|&i| host_order[i as usize]).collect();
    assert_eq!(sorted, want_keys, "{what}: keys (n = {n})");
}

#[test]
fn radix_sort_i64_matches_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut g = SplitMix(braid_tests::fresh_seed());
    for &n in &SIZES {
        // Wide values, narrow values (many ties: stability), and extremes.
        for shape in 0..3 {
            let v: Vec<i64> = (0..n)
                .map(|i| match shape {
                    0 => g.next_u64() as i64,
                    1 => (g.below(50) as i64) - 25,
                    _ => [i64::MIN, i64::MAX, 0, -1, 1][i % 5] ^ (g.below(2) as i64),
                })
                .collect();
            let keys = order_key_i64(&gpu, &DeviceBuffer::from_slice(&gpu, &v).unwrap()).unwrap();
            let host: Vec<u64> = v.iter().map(|&x| x as u64 ^ (1 << 63)).collect();
            assert_eq!(
                keys.to_vec::<u64>().unwrap(),
                host,
                "order keys i64, n = {n}"
            );
            check_sort(&gpu, keys, &host, &format!("i64 shape {shape}"));
        }
    }
}

#[test]
fn radix_sort_f64_matches_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut g = SplitMix(braid_tests::fresh_seed());
    let special = [
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -f64::NAN,
        f64::from_bits(0x7ff0_0000_dead_beef),
        1e-310,
        -1e-310,
    ];
    for &n in &SIZES {
        let v: Vec<f64> = (0..n)
            .map(|i| {
                if i % 17 == 0 {
                    special[(i / 17) % special.len()]
                } else {
                    (g.next_u64() as i64 as f64) / 1e9
                }
            })
            .collect();
        let keys = order_key_f64(&gpu, &DeviceBuffer::from_slice(&gpu, &v).unwrap()).unwrap();
        let host_keys: Vec<u64> = keys.to_vec().unwrap();
        // The map orders as DuckDB and Polars sort: by value, -0.0 equal to
        // 0.0, every NaN equal and above +inf. Checked on every pair of
        // neighbours in that order: keys equal exactly where values tie.
        let cmp = |x: f64, y: f64| match (x.is_nan(), y.is_nan()) {
            (true, true) => std::cmp::Ordering::Equal,
            (true, false) => std::cmp::Ordering::Greater,
            (false, true) => std::cmp::Ordering::Less,
            _ => x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal),
        };
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by(|&a, &b| cmp(v[a], v[b]));
        for w in idx.windows(2) {
            let (a, b) = (w[0], w[1]);
            assert_eq!(
                host_keys[a].cmp(&host_keys[b]),
                cmp(v[a], v[b]),
                "order keys of {} and {}",
                v[a],
                v[b]
            );
        }
        check_sort(&gpu, keys, &host_keys, "f64");
    }
}

/// Sorted random order values with ties and gaps.
fn sorted_ts(g: &mut SplitMix, n: usize) -> Vec<i64> {
    let mut t = g.below(1000) as i64 - 500;
    (0..n)
        .map(|_| {
            t += g.below(4) as i64; // 0: a tie
            t
        })
        .collect()
}

/// Compares a GPU aggregation column with the CPU kernel's.
fn check_agg(
    gpu_col: &braid_kernels::gpu::GpuAggColumn,
    cpu: &braid_kernels::rolling::AggColumn,
    what: &str,
) {
    assert_eq!(gpu_col.agg, cpu.agg, "{what}");
    let n = cpu.len();
    if cpu.agg == Agg::Count {
        let got: Vec<i64> = gpu_col.values.to_vec().unwrap();
        assert_eq!(got, cpu.counts().unwrap(), "{what}: counts");
        return;
    }
    let vals: Vec<f64> = gpu_col.values.to_vec().unwrap();
    let ok = gpu_col.valid.as_ref().unwrap().to_host().unwrap();
    assert_eq!(vals.len(), n, "{what}: rows");
    for i in 0..n {
        assert_eq!(ok[i] != 0, cpu.valid[i], "{what}: validity of row {i}");
        if cpu.valid[i] {
            let (a, b) = (vals[i], cpu.values[i]);
            let tol = 1e-9 * (1.0 + b.abs());
            assert!(
                a == b || (a - b).abs() <= tol || (a.is_nan() && b.is_nan()),
                "{what}: row {i}: gpu {a} cpu {b}"
            );
        }
    }
}

/// An ungrouped rolling input on the device: order values, values and
/// validity (one byte per row).
struct Uploaded {
    ts: DeviceBuffer,
    v: DeviceBuffer,
    ok: DeviceBuffer,
}

impl Uploaded {
    fn new(gpu: &Arc<Gpu>, ts: &[i64], v: &[f64], valid: &[bool]) -> Self {
        let ok: Vec<u8> = valid.iter().map(|b| u8::from(*b)).collect();
        Uploaded {
            ts: DeviceBuffer::from_slice(gpu, ts).unwrap(),
            v: DeviceBuffer::from_slice(gpu, v).unwrap(),
            ok: DeviceBuffer::from_host(gpu, &ok).unwrap(),
        }
    }

    /// The kernel's input: with the validity column only where `nulls`.
    fn input(&self, nulls: bool, emit_from: usize) -> RollingInput<'_> {
        RollingInput {
            ts: &self.ts,
            key: None,
            values: &self.v,
            valid: nulls.then_some(&self.ok),
            emit_from,
        }
    }
}

#[test]
fn rolling_matches_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut g = SplitMix(braid_tests::fresh_seed());
    let aggs = Agg::ALL;
    for &n in &[
        0usize, 1, 2, 31, 32, 33, 1023, 1025, 2047, 2049, 4097, 100_003, 1_000_001,
    ] {
        for (c, closed) in [Closed::Right, Closed::Both, Closed::Left, Closed::None]
            .into_iter()
            .enumerate()
        {
            // Shapes: short windows (the shared-memory pass), windows over
            // everything, long runs of one ts (past a tile), NaN values
            // (the last three go to the general pass).
            let shape = (c + n) % 4;
            let window = match shape {
                1 => 1 << 40,
                _ => [0i64, 1, 3, 40, 700, 1500, 2500][g.below(7) as usize],
            };
            let ts = if shape == 2 {
                let mut t = 0i64;
                (0..n)
                    .map(|_| {
                        t += i64::from(g.below(300) == 0);
                        t
                    })
                    .collect()
            } else {
                sorted_ts(&mut g, n)
            };
            let v: Vec<f64> = (0..n)
                .map(|_| {
                    if shape == 3 && g.below(5000) == 0 {
                        f64::NAN
                    } else {
                        (g.below(20_001) as f64 - 10_000.0) / 7.0
                    }
                })
                .collect();
            let nulls = g.below(2) == 0;
            let valid: Vec<bool> = (0..n).map(|_| !nulls || g.below(10) != 0).collect();
            let emit_from = if n == 0 {
                0
            } else {
                g.below(n as u64 / 4 + 1) as usize
            };
            let what = format!(
                "n = {n}, shape {shape}, {closed:?}, window {window}, nulls {nulls}, emit from {emit_from}"
            );
            let up = Uploaded::new(&gpu, &ts, &v, &valid);
            let got = rolling(&gpu, up.input(nulls, emit_from), window, closed, &aggs).unwrap();
            let want = cpu_rolling(
                &ts,
                &v,
                nulls.then_some(&valid[..]),
                window,
                closed,
                &aggs,
                emit_from,
            )
            .unwrap();
            for (a, b) in got.iter().zip(&want.columns) {
                check_agg(a, b, &what);
            }
        }
    }
}

/// Variance of data far from 0 with a small spread (a mean of 1e9, a
/// spread of 1e-3, windows of 2 to ~40 rows): the tile pass sums the
/// squares about a value of the tile, so std and var keep every digit the
/// CPU kernel keeps (relative 1e-9; about 0 they lost ~1e-7).
#[test]
fn rolling_variance_of_offset_data_matches_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut g = SplitMix(braid_tests::fresh_seed());
    let aggs = [Agg::Std, Agg::Var];
    let n = 200_003;
    for (k, window) in [2i64, 12, 40].into_iter().enumerate() {
        let ts = sorted_ts(&mut g, n);
        let sign = if k == 1 { -1.0 } else { 1.0 };
        let v: Vec<f64> = (0..n)
            .map(|_| sign * (1e9 + g.below(1000) as f64 * 1e-6))
            .collect();
        let nulls = k == 2;
        let valid: Vec<bool> = (0..n).map(|_| !nulls || g.below(10) != 0).collect();
        let up = Uploaded::new(&gpu, &ts, &v, &valid);
        let got = rolling(&gpu, up.input(nulls, 0), window, Closed::Both, &aggs).unwrap();
        let want = cpu_rolling(
            &ts,
            &v,
            nulls.then_some(&valid[..]),
            window,
            Closed::Both,
            &aggs,
            0,
        )
        .unwrap();
        for (a, b) in got.iter().zip(&want.columns) {
            let vals: Vec<f64> = a.values.to_vec().unwrap();
            let okg = a.valid.as_ref().unwrap().to_host().unwrap();
            for i in 0..n {
                assert_eq!(
                    okg[i] != 0,
                    b.valid[i],
                    "window {window}: validity of row {i}"
                );
                if b.valid[i] {
                    let (x, y) = (vals[i], b.values[i]);
                    // A window of equal values: 0 on the CPU, within
                    // rounding of it here (the smallest non-zero variance
                    // of these values is 5e-13, its std 7e-7).
                    let zero = if b.agg == Agg::Std { 1e-14 } else { 1e-28 };
                    assert!(
                        (x - y).abs() <= 1e-9 * y.abs() + zero,
                        "window {window}, {:?}: row {i}: gpu {x} cpu {y}",
                        b.agg
                    );
                }
            }
        }
    }
}

/// The tile pass's plain scans keep a result only within 2^-36 of it by
/// their error bound; short windows that fail it are summed from their
/// rows, other tiles go to the double-double scans. Over data where each
/// of those happens (uniform values: the plain scans; runs of small
/// integers: windows of equal values, variance 0; mixed signs with runs
/// of zeros: sums of 0; magnitudes 10^0..10^8: bounds that fail), every
/// sum, mean, std and var is within 2^-34 of the CPU kernel's (near
/// exact: compensated sums and merged moments), not merely the 1e-9 of
/// the other tests, and a 0 stays (within 1e-20 of the data's scale) 0.
#[test]
fn rolling_sums_keep_their_error_bound() {
    let Some(gpu) = gpu() else { return };
    let mut g = SplitMix(braid_tests::fresh_seed());
    let aggs = [Agg::Sum, Agg::Mean, Agg::Std, Agg::Var, Agg::Count];
    let n = 300_007;
    for kind in 0..4 {
        for window in [3i64, 16, 64, 300] {
            let ts = sorted_ts(&mut g, n);
            let mut cur = 0.0f64;
            let v: Vec<f64> = (0..n)
                .map(|_| match kind {
                    0 => g.below(1_000_000) as f64 / 1000.0,
                    1 => {
                        if g.below(50) == 0 {
                            cur = g.below(3) as f64;
                        }
                        cur
                    }
                    2 => {
                        if g.below(40) == 0 {
                            cur = if g.below(2) == 0 { 0.0 } else { 1.0 };
                        }
                        cur * (g.below(20_001) as f64 - 10_000.0) / 7.0
                    }
                    _ => {
                        let m = 10f64.powi(g.below(9) as i32);
                        let sign = if g.below(2) == 0 { -1.0 } else { 1.0 };
                        sign * m * (1.0 + g.below(1000) as f64 / 1000.0)
                    }
                })
                .collect();
            let nulls = window == 16;
            let valid: Vec<bool> = (0..n).map(|_| !nulls || g.below(8) != 0).collect();
            let scale = v.iter().fold(0.0f64, |a, x| a.max(x.abs())).max(1.0) * 2048.0;
            let up = Uploaded::new(&gpu, &ts, &v, &valid);
            let got = rolling(&gpu, up.input(nulls, 0), window, Closed::Right, &aggs).unwrap();
            let want = cpu_rolling(
                &ts,
                &v,
                nulls.then_some(&valid[..]),
                window,
                Closed::Right,
                &aggs,
                0,
            )
            .unwrap();
            for (a, b) in got.iter().zip(&want.columns) {
                if b.agg == Agg::Count {
                    check_agg(a, b, "count");
                    continue;
                }
                let vals: Vec<f64> = a.values.to_vec().unwrap();
                let okg = a.valid.as_ref().unwrap().to_host().unwrap();
                let zero = match b.agg {
                    Agg::Var => 1e-20 * scale * scale,
                    Agg::Std => 1e-10 * scale,
                    _ => 1e-20 * scale,
                };
                for i in 0..n {
                    assert_eq!(
                        okg[i] != 0,
                        b.valid[i],
                        "kind {kind}, window {window}: validity of row {i}"
                    );
                    if b.valid[i] {
                        let (x, y) = (vals[i], b.values[i]);
                        assert!(
                            (x - y).abs() <= 5.8e-11 * y.abs() + zero,
                            "kind {kind}, window {window}, {:?}: row {i}: gpu {x} cpu {y}",
                            b.agg
                        );
                    }
                }
            }
        }
    }
}

/// Min and max asked alone (the tile pass then keeps infinities, which
/// only the sums send to the general pass), over windows of one row to
/// hundreds, inside one min/max block and over many, with nulls from none
/// to nearly all (windows of nothing but nulls, blocks of nothing but
/// nulls), and with count asked next to them.
#[test]
fn rolling_min_max_match_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut g = SplitMix(braid_tests::fresh_seed());
    let sets: [&[Agg]; 3] = [&[Agg::Min, Agg::Max], &[Agg::Min], &[Agg::Max, Agg::Count]];
    for &n in &[1usize, 2, 7, 513, 2049, 5000, 100_003] {
        for (c, closed) in [Closed::Right, Closed::Both, Closed::Left, Closed::None]
            .into_iter()
            .enumerate()
        {
            let ts = sorted_ts(&mut g, n);
            // Per mille of null rows.
            let null_pm = [0u64, 100, 500, 950][(c + n) % 4];
            let v: Vec<f64> = (0..n)
                .map(|_| match g.below(200) {
                    0 => f64::INFINITY,
                    1 => f64::NEG_INFINITY,
                    _ => (g.below(20_001) as f64 - 10_000.0) / 7.0,
                })
                .collect();
            let valid: Vec<bool> = (0..n).map(|_| g.below(1000) >= null_pm).collect();
            let up = Uploaded::new(&gpu, &ts, &v, &valid);
            for aggs in sets {
                let window = [0i64, 1, 3, 7, 12, 40, 300, 700, 1500][g.below(9) as usize];
                let nulls = null_pm > 0;
                let emit_from = g.below(n as u64 / 4 + 1) as usize;
                let got = rolling(&gpu, up.input(nulls, emit_from), window, closed, aggs).unwrap();
                let want = cpu_rolling(
                    &ts,
                    &v,
                    nulls.then_some(&valid[..]),
                    window,
                    closed,
                    aggs,
                    emit_from,
                )
                .unwrap();
                let what = format!(
                    "n = {n}, {aggs:?}, {closed:?}, window {window}, nulls {null_pm}/1000, emit from {emit_from}"
                );
                assert_eq!(got.len(), want.columns.len(), "{what}");
                for (a, b) in got.iter().zip(&want.columns) {
                    check_agg(a, b, &what);
                }
            }
        }
    }
}

/// Order values far from one step per unit: scaled steps (each bucket of
/// the tile pass's ts index then spans many units), bursts split by wide
/// gaps (buckets holding many rows, and gaps too wide for the index),
/// values up to both ends of i64 (ties at i64::MAX included), and steps
/// of 0-3 units with a rare gap of 4 to 100 (one unit a bucket: rows that
/// start 4 buckets, 5 to 64, and more than the index fills per row).
#[test]
fn rolling_sparse_order_values_match_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut g = SplitMix(braid_tests::fresh_seed());
    for &n in &[1usize, 2, 2049, 4097, 100_003] {
        for shape in 0..4 {
            let (ts, unit): (Vec<i64>, i64) = match shape {
                0 => {
                    let mut t = g.next_u64() as i64 / 4;
                    let ts = (0..n)
                        .map(|_| {
                            t += g.below(4) as i64 * 1_000_003;
                            t
                        })
                        .collect();
                    (ts, 1_000_003)
                }
                1 => {
                    let mut t = -(g.below(1 << 40) as i64);
                    let ts = (0..n)
                        .map(|i| {
                            t += if i % 50 == 49 {
                                [1_000, 1_000_000, 1 << 40][g.below(3) as usize]
                            } else {
                                g.below(3) as i64
                            };
                            t
                        })
                        .collect();
                    (ts, 1)
                }
                3 => {
                    let mut t = g.below(1000) as i64 - 500;
                    let ts = (0..n)
                        .map(|_| {
                            // About one gap in 200 rows keeps a tile's
                            // span of ts within the index's buckets.
                            t += if g.below(200) == 0 {
                                [4, 5, 9, 33, 64, 65, 100][g.below(7) as usize]
                            } else {
                                g.below(4) as i64
                            };
                            t
                        })
                        .collect();
                    (ts, 1)
                }
                _ => {
                    let mut t = i64::MIN + g.below(4) as i64;
                    let ts = (0..n)
                        .map(|_| {
                            t = t.saturating_add((g.next_u64() >> (4 + g.below(56))) as i64);
                            t
                        })
                        .collect();
                    (ts, 1 << 50)
                }
            };
            let v: Vec<f64> = (0..n)
                .map(|_| (g.below(20_001) as f64 - 10_000.0) / 3.0)
                .collect();
            let d_ts = DeviceBuffer::from_slice(&gpu, &ts).unwrap();
            let d_v = DeviceBuffer::from_slice(&gpu, &v).unwrap();
            for closed in [Closed::Right, Closed::Both, Closed::Left, Closed::None] {
                let window = [0, 1, 2 * unit, 40 * unit, 700 * unit, i64::MAX][g.below(6) as usize];
                let emit_from = g.below(n as u64 / 4 + 1) as usize;
                let input = RollingInput {
                    ts: &d_ts,
                    key: None,
                    values: &d_v,
                    valid: None,
                    emit_from,
                };
                let got = rolling(&gpu, input, window, closed, &Agg::ALL).unwrap();
                let want =
                    cpu_rolling(&ts, &v, None, window, closed, &Agg::ALL, emit_from).unwrap();
                let what = format!(
                    "n = {n}, shape {shape}, {closed:?}, window {window}, emit from {emit_from}"
                );
                for (a, b) in got.iter().zip(&want.columns) {
                    check_agg(a, b, &what);
                }
            }
        }
    }
}

/// Ascending keys (from `first`, with gaps) in runs of 1 to `most(g)` rows
/// covering `n` rows, and the offsets where each run starts (and `n`).
fn random_groups(
    g: &mut SplitMix,
    n: usize,
    first: i64,
    most: impl Fn(&mut SplitMix) -> u64,
) -> (Vec<i64>, Vec<usize>) {
    let mut key = Vec::with_capacity(n);
    let mut offsets = vec![0usize];
    let mut k = first;
    while key.len() < n {
        let m = most(g);
        let len = (1 + g.below(m) as usize).min(n - key.len());
        key.extend(std::iter::repeat_n(k, len));
        offsets.push(key.len());
        k += 1 + g.below(3) as i64;
    }
    (key, offsets)
}

#[test]
fn rolling_grouped_matches_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut g = SplitMix(braid_tests::fresh_seed());
    let aggs = [
        Agg::Var,
        Agg::Count,
        Agg::Sum,
        Agg::Min,
        Agg::Max,
        Agg::Mean,
        Agg::Std,
        Agg::Sum,
    ];
    for &n in &[1usize, 2, 33, 4097, 100_003, 1_000_001] {
        for closed in [Closed::Right, Closed::Both, Closed::Left, Closed::None] {
            let window = [0i64, 2, 25, 1 << 40][g.below(4) as usize];
            // Groups of random length, keys ascending (with gaps).
            let first = g.below(100) as i64 - 50;
            let (key, offsets) =
                random_groups(&mut g, n, first, |g| if g.below(2) == 0 { 5 } else { 3000 });
            let mut ts = Vec::with_capacity(n);
            for w in offsets.windows(2) {
                ts.extend(sorted_ts(&mut g, w[1] - w[0]));
            }
            let v: Vec<f64> = (0..n)
                .map(|_| g.below(1000) as f64 * 0.25 - 100.0)
                .collect();
            let valid: Vec<bool> = (0..n).map(|_| g.below(7) != 0).collect();
            let what = format!(
                "grouped n = {n}, {} groups, {closed:?}, window {window}",
                offsets.len() - 1
            );
            let d_ts = DeviceBuffer::from_slice(&gpu, &ts).unwrap();
            let d_key = DeviceBuffer::from_slice(&gpu, &key).unwrap();
            let d_v = DeviceBuffer::from_slice(&gpu, &v).unwrap();
            let ok: Vec<u8> = valid.iter().map(|b| u8::from(*b)).collect();
            let d_ok = DeviceBuffer::from_host(&gpu, &ok).unwrap();
            let input = RollingInput {
                ts: &d_ts,
                key: Some(&d_key),
                values: &d_v,
                valid: Some(&d_ok),
                emit_from: 0,
            };
            let got = rolling(&gpu, input, window, closed, &aggs).unwrap();
            let want = rolling_segments(
                &ts,
                &v,
                Some(&valid),
                Segments::new(&offsets),
                window,
                closed,
                &aggs,
            )
            .unwrap();
            assert_eq!(got.len(), aggs.len());
            for (a, b) in got.iter().zip(&want.columns) {
                check_agg(a, b, &what);
            }
        }
    }
}

#[test]
fn casts_and_lower_bound_match_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut g = SplitMix(braid_tests::fresh_seed());
    for &n in &SIZES[..8] {
        let v: Vec<i32> = (0..n).map(|_| g.next_u64() as i32).collect();
        let d = DeviceBuffer::from_slice(&gpu, &v).unwrap();
        let f: Vec<f64> = cast_to_f64(&gpu, &d, NumType::I32)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_eq!(
            f,
            v.iter().map(|x| *x as f64).collect::<Vec<_>>(),
            "i32 -> f64, n = {n}"
        );
        let i: Vec<i64> = cast_to_i64(&gpu, &d, NumType::I32)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_eq!(
            i,
            v.iter().map(|x| *x as i64).collect::<Vec<_>>(),
            "i32 -> i64, n = {n}"
        );
        let u: Vec<u16> = (0..n).map(|_| g.next_u64() as u16).collect();
        let d = DeviceBuffer::from_slice(&gpu, &u).unwrap();
        let i: Vec<i64> = cast_to_i64(&gpu, &d, NumType::U16)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_eq!(
            i,
            u.iter().map(|x| *x as i64).collect::<Vec<_>>(),
            "u16 -> i64, n = {n}"
        );
        let x: Vec<f32> = (0..n).map(|_| g.next_u64() as i32 as f32 / 3.0).collect();
        let d = DeviceBuffer::from_slice(&gpu, &x).unwrap();
        let f: Vec<f64> = cast_to_f64(&gpu, &d, NumType::F32)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_eq!(
            f,
            x.iter().map(|x| *x as f64).collect::<Vec<_>>(),
            "f32 -> f64, n = {n}"
        );
        // lower_bound against partition_point.
        let mut s: Vec<u64> = (0..n).map(|_| g.below(1000)).collect();
        s.sort_unstable();
        let q: Vec<u64> = (0..37).map(|_| g.below(1100)).collect();
        let got: Vec<u64> = lower_bound(
            &gpu,
            &DeviceBuffer::from_slice(&gpu, &s).unwrap(),
            &DeviceBuffer::from_slice(&gpu, &q).unwrap(),
        )
        .unwrap()
        .to_vec()
        .unwrap();
        let want: Vec<u64> = q
            .iter()
            .map(|x| s.partition_point(|y| y < x) as u64)
            .collect();
        assert_eq!(got, want, "lower_bound, n = {n}");
    }
}

#[test]
fn device_table_round_trips() {
    use arrow_array::{Array, BooleanArray, Float32Array, Int16Array, Int64Array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};
    use braid_core::cuda::DeviceTable;
    let Some(gpu) = gpu() else { return };
    let mut g = SplitMix(braid_tests::fresh_seed());
    for &n in &[0usize, 1, 7, 1000, 100_003] {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Float32, true),
            Field::new("c", DataType::Int16, true),
            Field::new("d", DataType::Boolean, true),
        ]));
        let a = Int64Array::from((0..n).map(|_| g.next_u64() as i64).collect::<Vec<_>>());
        let b = Float32Array::from(
            (0..n)
                .map(|_| (g.below(3) > 0).then(|| g.below(100) as f32))
                .collect::<Vec<_>>(),
        );
        let c = Int16Array::from(
            (0..n)
                .map(|_| (g.below(5) > 0).then(|| g.next_u64() as i16))
                .collect::<Vec<_>>(),
        );
        let d = BooleanArray::from(
            (0..n)
                .map(|_| (g.below(4) > 0).then(|| g.below(2) == 0))
                .collect::<Vec<_>>(),
        );
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(a), Arc::new(b), Arc::new(c), Arc::new(d)],
        )
        .unwrap();
        // A sliced batch (offsets inside the Arrow buffers) too.
        let off = n / 3;
        for input in [batch.clone(), batch.slice(off, n - off)] {
            let t = DeviceTable::from_batch(&gpu, &input).unwrap();
            assert_eq!(t.to_batch().unwrap(), input, "round trip, n = {n}");
            let packed = t.pack(&gpu).unwrap();
            let back = DeviceTable::unpack(&gpu, schema.clone(), &packed).unwrap();
            assert_eq!(back.to_batch().unwrap(), input, "pack/unpack, n = {n}");
            let k = input.num_rows() / 2;
            let s = t.slice(&gpu, k, input.num_rows() - k).unwrap();
            assert_eq!(
                s.to_batch().unwrap(),
                input.slice(k, input.num_rows() - k),
                "slice, n = {n}"
            );
            let _ = s.to_batch().unwrap().column(0).len();
        }
    }
    // Strings have no device form: a clear error.
    let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, false)]));
    let batch = RecordBatch::try_new(
        schema,
        vec![Arc::new(arrow_array::StringArray::from(vec!["x"]))],
    )
    .unwrap();
    let e = DeviceTable::from_batch(&gpu, &batch)
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"s\""), "{e}");
}

/// Many host batches to one device table and back in slabs, through the
/// pinned pool's blocks (columns larger than one staging block) and
/// without them (the pool full), against the batches concatenated on the
/// host.
#[test]
fn device_table_from_many_batches_round_trips() {
    use arrow_array::{BooleanArray, Float64Array, Int32Array, Int64Array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};
    use braid_core::cuda::DeviceTable;
    let Some(gpu) = gpu() else { return };
    let mut g = SplitMix(braid_tests::fresh_seed());
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, false),
        Field::new("b", DataType::Float64, true),
        Field::new("c", DataType::Int32, true),
        Field::new("d", DataType::Boolean, false),
    ]));
    // About 2.2M rows: 17 MiB of each 8-byte column, over two 8 MiB
    // staging blocks; some batches empty, some sliced, nulls in some only.
    let mut batches = Vec::new();
    while batches.iter().map(RecordBatch::num_rows).sum::<usize>() < 2_200_000 {
        let n = match g.below(6) {
            0 => 0,
            1 => g.below(10) as usize,
            _ => g.below(300_000) as usize,
        };
        let nulls = g.below(2) == 0;
        let a = Int64Array::from((0..n).map(|_| g.next_u64() as i64).collect::<Vec<_>>());
        let b = Float64Array::from(
            (0..n)
                .map(|_| (!nulls || g.below(3) > 0).then(|| g.next_u64() as f64))
                .collect::<Vec<_>>(),
        );
        let c = Int32Array::from(
            (0..n)
                .map(|_| (!nulls || g.below(5) > 0).then(|| g.next_u64() as i32))
                .collect::<Vec<_>>(),
        );
        let d = BooleanArray::from((0..n).map(|_| g.below(2) == 0).collect::<Vec<_>>());
        let b = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(a), Arc::new(b), Arc::new(c), Arc::new(d)],
        )
        .unwrap();
        let off = if n > 2 {
            g.below(n as u64 / 2) as usize
        } else {
            0
        };
        batches.push(b.slice(off, n - off));
    }
    let all = arrow_select::concat::concat_batches(&schema, &batches).unwrap();
    let rows = all.num_rows();
    let mut check = |what: &str| {
        let t = DeviceTable::from_batches(&gpu, schema.clone(), &batches).unwrap();
        assert_eq!(t.num_rows(), rows);
        // Slabs of odd sizes, small and large, held until all are checked
        // (as downstream nodes hold their chunks).
        // Every other step starts two slabs' copies at once and finishes
        // the second first (as the job's emit overlaps them); one in
        // flight is dropped unfinished now and then.
        let mut held = Vec::new();
        let mut at = 0;
        let mut step = 0;
        while at < rows {
            let len = (g.below(1_500_000) as usize + 1).min(rows - at);
            step += 1;
            if step % 2 == 0 && at + len < rows {
                let len2 = (g.below(1_500_000) as usize + 1).min(rows - at - len);
                let a = t.start_rows(at, len).unwrap();
                let b = t.start_rows(at + len, len2).unwrap();
                if step % 6 == 0 {
                    drop(t.start_rows(at, len).unwrap());
                }
                let (sa, sb) = (b.finish().unwrap(), a.finish().unwrap());
                let (sa, sb) = (sb, sa);
                assert_eq!(
                    sa,
                    all.slice(at, len),
                    "{what}: rows {at}..{} in flight",
                    at + len
                );
                let at2 = at + len;
                assert_eq!(
                    sb,
                    all.slice(at2, len2),
                    "{what}: rows {at2}..{} in flight",
                    at2 + len2
                );
                held.push(sa);
                held.push(sb);
                at += len + len2;
            } else {
                let slab = t.rows_to_batch(at, len).unwrap();
                assert_eq!(slab, all.slice(at, len), "{what}: rows {at}..{}", at + len);
                held.push(slab);
                at += len;
            }
        }
    };
    check("pinned");
    let pool = gpu.pinned().clone();
    let cap = pool.cap();
    let after_one = pool.held_bytes();
    assert!(after_one > 0 && after_one <= cap, "{after_one} of {cap}");
    // Reuse: another round trip allocates no more than the cap.
    check("pinned again");
    assert!(pool.held_bytes() <= cap);
    // With every block taken, copies fall back to pageable memory.
    let mut taken = Vec::new();
    while let Some(b) = pool.take(0, 1 << 20).unwrap() {
        taken.push(b);
    }
    assert!(pool.held_bytes() <= cap);
    check("pageable");
    drop(taken);
    check("pinned after");
}

#[test]
fn rolling_edges_match_cpu() {
    let Some(gpu) = gpu() else { return };
    // Order values at i64::MIN (t - w below it: no lower cut), huge values
    // (x^2 overflows: the general pass), and magnitudes far apart.
    let cases: Vec<(Vec<i64>, Vec<f64>, i64)> = vec![
        (
            vec![i64::MIN, i64::MIN, i64::MIN + 1, i64::MIN + 3, 0, i64::MAX],
            vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            2,
        ),
        (vec![1, 2, 3, 4], vec![2e154, 2e154, 2e154, 2e154], 5),
        (vec![1, 2, 3, 4, 5], vec![1e300, 1.0, 1e-20, 3.0, 1e-20], 1),
    ];
    // Random magnitudes up to 1e200 among ordinary values (x^2 and the
    // shifted sums overflow in some windows, not in others), and the same
    // with infinities: over the general pass's blocks and its row ends.
    let mut cases = cases;
    let mut g = SplitMix(braid_tests::fresh_seed());
    for (n, window) in [(300usize, 3i64), (5000, 40), (5000, 1000)] {
        for infinities in [false, true] {
            let ts = sorted_ts(&mut g, n);
            let v = (0..n)
                .map(|_| {
                    let u = (g.below(2_000_001) as f64 - 1e6) / 1e6;
                    match g.below(10) {
                        0..=2 => u * 10f64.powi(100 + g.below(100) as i32),
                        3 if infinities => [f64::INFINITY, f64::NEG_INFINITY][g.below(2) as usize],
                        _ => u * 50.0,
                    }
                })
                .collect();
            cases.push((ts, v, window));
        }
    }
    for (ts, v, window) in cases {
        for closed in [Closed::Right, Closed::Both, Closed::Left, Closed::None] {
            let d_ts = DeviceBuffer::from_slice(&gpu, &ts).unwrap();
            let d_v = DeviceBuffer::from_slice(&gpu, &v).unwrap();
            let input = RollingInput {
                ts: &d_ts,
                key: None,
                values: &d_v,
                valid: None,
                emit_from: 0,
            };
            let got = rolling(&gpu, input, window, closed, &Agg::ALL).unwrap();
            let want = cpu_rolling(&ts, &v, None, window, closed, &Agg::ALL, 0).unwrap();
            let what = if ts.len() <= 8 {
                format!("{ts:?} {v:?} window {window} {closed:?}")
            } else {
                format!("{} random rows, window {window} {closed:?}", ts.len())
            };
            for (a, b) in got.iter().zip(&want.columns) {
                check_agg(a, b, &what);
            }
        }
    }
}

/// Sorted order values in `unit`s, `per_day` rows a day on average over
/// about three years from 2022 (or from the given day), half of them on
/// the 28th to the 31st of a month (where the edge of a month back is
/// clamped and can move back), at random times of day.
fn calendar_ts(
    g: &mut SplitMix,
    n: usize,
    per_day: f64,
    unit: CalendarUnit,
    from_day: i64,
) -> Vec<i64> {
    let span = ((n as f64 / per_day).ceil() as u64).max(1);
    let mut ts: Vec<i64> = (0..n)
        .map(|_| {
            let mut day = from_day + g.below(span) as i64;
            if g.below(2) == 0 {
                day = braid_tests::toward_month_end(day, g.below(4) as i64);
            }
            let per = unit.per_day();
            day * per + g.below(per as u64) as i64
        })
        .collect();
    ts.sort_unstable();
    ts
}

#[test]
fn rolling_calendar_windows_match_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut g = SplitMix(braid_tests::fresh_seed());
    let units = [
        CalendarUnit::Millis,
        CalendarUnit::Days,
        CalendarUnit::Micros,
        CalendarUnit::Seconds,
    ];
    // Rows a day: a month's window of ~15-300 rows (the tile pass), of
    // ~900-1300 (the long-window pass), of thousands (the general pass).
    for (i, &(n, per_day)) in [
        (1usize, 1.0f64),
        (2, 1.0),
        (1025, 0.5),
        (4097, 3.0),
        (100_003, 10.0),
        (100_003, 40.0),
        (300_001, 150.0),
    ]
    .iter()
    .enumerate()
    {
        for (c, closed) in [Closed::Right, Closed::Both, Closed::Left, Closed::None]
            .into_iter()
            .enumerate()
        {
            let unit = units[(i + c) % units.len()];
            let months = [1u32, 2, 3, 12][g.below(4) as usize];
            let then = [0, 15 * unit.per_day(), 1][g.below(3) as usize];
            let window = Window::Calendar { months, then, unit };
            // Dates before and after 1970 (Days also far back).
            let from = if unit == CalendarUnit::Days && g.below(2) == 0 {
                -800_000
            } else {
                [18_993i64, -1200][g.below(2) as usize]
            };
            let per_day = if unit == CalendarUnit::Days {
                per_day.min(40.0)
            } else {
                per_day
            };
            let ts = calendar_ts(&mut g, n, per_day, unit, from);
            let v: Vec<f64> = (0..n)
                .map(|_| (g.below(20_001) as f64 - 10_000.0) / 7.0)
                .collect();
            let nulls = g.below(2) == 0;
            let valid: Vec<bool> = (0..n).map(|_| !nulls || g.below(9) != 0).collect();
            let emit_from = g.below(n as u64 / 4 + 1) as usize;
            let what = format!(
                "calendar n = {n}, {per_day} a day, {window:?}, {closed:?}, nulls {nulls}, emit from {emit_from}"
            );
            let up = Uploaded::new(&gpu, &ts, &v, &valid);
            let got = rolling(&gpu, up.input(nulls, emit_from), window, closed, &Agg::ALL).unwrap();
            let want = cpu_rolling(
                &ts,
                &v,
                nulls.then_some(&valid[..]),
                window,
                closed,
                &Agg::ALL,
                emit_from,
            )
            .unwrap();
            for (a, b) in got.iter().zip(&want.columns) {
                check_agg(a, b, &what);
            }
            // Grouped: the same rows cut into keys, each its own series.
            if n >= 2 {
                let (key, offsets) = random_groups(&mut g, n, -3, |_| 5000);
                let mut gts = Vec::with_capacity(n);
                for w in offsets.windows(2) {
                    gts.extend(calendar_ts(&mut g, w[1] - w[0], per_day, unit, from));
                }
                let d_ts = DeviceBuffer::from_slice(&gpu, &gts).unwrap();
                let d_key = DeviceBuffer::from_slice(&gpu, &key).unwrap();
                let input = RollingInput {
                    ts: &d_ts,
                    key: Some(&d_key),
                    values: &up.v,
                    valid: nulls.then_some(&up.ok),
                    emit_from: 0,
                };
                let got = rolling(&gpu, input, window, closed, &Agg::ALL).unwrap();
                let want = rolling_segments(
                    &gts,
                    &v,
                    nulls.then_some(&valid[..]),
                    Segments::new(&offsets),
                    window,
                    closed,
                    &Agg::ALL,
                )
                .unwrap();
                for (a, b) in got.iter().zip(&want.columns) {
                    check_agg(a, b, &format!("grouped {what}"));
                }
            }
        }
    }
    // Near the ends of i64: a month back from the first rows lies below
    // i64::MIN (no lower edge), from the last ones it does not; day counts
    // past 2^28 and 2^24 months or more (the kernels' 64-bit date path).
    let cases = [
        (CalendarUnit::Nanos, i64::MIN, 1u32, Closed::Right),
        (
            CalendarUnit::Nanos,
            i64::MIN + 5_000_000_000_000_000,
            1,
            Closed::Both,
        ),
        (
            CalendarUnit::Nanos,
            i64::MAX - 9_000_000_000_000_000,
            1,
            Closed::Left,
        ),
        (CalendarUnit::Seconds, i64::MIN, 1, Closed::None),
        (
            CalendarUnit::Seconds,
            i64::MAX - 4_000_000_000_000_000_000,
            1 << 25,
            Closed::Right,
        ),
        (
            CalendarUnit::Millis,
            -2_000_000_000_000_000_000,
            13,
            Closed::Both,
        ),
        (CalendarUnit::Days, -100_000, 1 << 24, Closed::Left),
    ];
    for (unit, start, months, closed) in cases {
        let n = 3000usize;
        let span = if unit == CalendarUnit::Days {
            200_000
        } else {
            4_000_000_000_000_000
        };
        let mut ts: Vec<i64> = (0..n)
            .map(|_| start.saturating_add((g.next_u64() >> 2) as i64 % span))
            .collect();
        ts.sort_unstable();
        let v: Vec<f64> = (0..n).map(|_| g.below(1000) as f64).collect();
        let window = Window::Calendar {
            months,
            then: 0,
            unit,
        };
        let up = Uploaded::new(&gpu, &ts, &v, &vec![true; n]);
        let got = rolling(&gpu, up.input(false, 0), window, closed, &Agg::ALL).unwrap();
        let want = cpu_rolling(&ts, &v, None, window, closed, &Agg::ALL, 0).unwrap();
        for (a, b) in got.iter().zip(&want.columns) {
            check_agg(a, b, &format!("{window:?} from {start}, {closed:?}"));
        }
    }
}

/// Asking for more device memory than the GPU has fails with an error
/// that names the call, the size asked for and what the device has free;
/// the GPU stays usable after it.
#[test]
fn too_large_a_device_buffer_is_a_clear_error() {
    let Some(gpu) = gpu() else { return };
    let err = match DeviceBuffer::alloc(&gpu, 1 << 50) {
        Ok(_) => panic!("a 1 PiB device buffer was allocated"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("cuMemAlloc") && err.contains("1048576.00 GiB asked") && err.contains("free"),
        "unclear error: {err}"
    );
    let b = DeviceBuffer::from_slice(&gpu, &[1u64, 2, 3]).unwrap();
    assert_eq!(b.to_vec::<u64>().unwrap(), vec![1, 2, 3]);
}
