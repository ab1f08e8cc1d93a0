//! GPU kernels (feature `cuda`) against CPU references on fresh random
//! data, with every device allocation poisoned (`BRAID_POISON_DEVICE`), at
//! sizes around and off the block and tile sizes. Without a GPU the tests
//! say they skipped and pass.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use braid_core::cuda::{DeviceBuffer, Gpu};
use braid_kernels::gpu::{gather, hash_partition, order_key_f64, order_key_i64, radix_sort};
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
        // The map is monotone: sorting by it is sorting by value (NaN last).
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by(|&a, &b| {
            let (x, y) = (v[a], v[b]);
            match (x.is_nan(), y.is_nan()) {
                (true, true) => std::cmp::Ordering::Equal,
                (true, false) => std::cmp::Ordering::Greater,
                (false, true) => std::cmp::Ordering::Less,
                _ => x.total_cmp(&y),
            }
        });
        for w in idx.windows(2) {
            let (a, b) = (w[0], w[1]);
            let ord_vals = v[a].is_nan() || v[b].is_nan() || v[a].total_cmp(&v[b]).is_le();
            assert!(ord_vals);
            assert!(
                host_keys[a] <= host_keys[b] || v[a] == v[b],
                "order key of {} above that of {}",
                v[a],
                v[b]
            );
        }
        check_sort(&gpu, keys, &host_keys, "f64");
    }
}
