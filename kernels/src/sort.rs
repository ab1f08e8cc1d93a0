//! Stable LSD radix sort of 64-bit keys with a 64-bit payload each, on the
//! CPU: what a local sort by one or two integer columns needs (the payload
//! says where each row came from); and the gather that then moves a
//! column's values into that order ([`gather_packed`]).
//!
//! ```text
//!   1 pass:   the histograms of all 8 key bytes at once
//!   k passes: for each byte whose histogram is not a single bucket, a
//!             stable scatter of keys and payloads by that byte
//! ```
//!
//! Cost: one read of the keys, then per non-constant byte one read and one
//! write of keys and payloads (16 bytes per element each way). Keys that
//! span a small range (timestamps of one day, group ids) skip their high
//! bytes, so a sort of 10 M time stamps takes 4-5 passes, against about
//! 23 compare levels for a comparison sort. Memory: the inputs plus one
//! scratch copy of each. [`radix_sort_pairs_on`] runs each pass on
//! several threads (contiguous blocks, each scattering into its own
//! slices), for one more read of the keys a pass.

use crate::par::map_scoped;

/// Bytes of a key.
const DIGITS: usize = 8;
/// Buckets per byte.
const BUCKETS: usize = 256;

/// The order-preserving map of an i64 onto u64 (flips the sign bit), so
/// that unsigned order is signed order.
pub fn order_key(x: i64) -> u64 {
    (x as u64) ^ (1 << 63)
}

/// Sorts `keys` ascending and moves each entry of `payload` with its key;
/// stable (equal keys keep their order). Returns the sorted keys and
/// payloads, both as long as the shorter input.
pub fn radix_sort_pairs(keys: Vec<u64>, payload: Vec<u64>) -> (Vec<u64>, Vec<u64>) {
    radix_sort_pairs_on(keys, payload, 1)
}

/// Fewest elements a thread of [`radix_sort_pairs_on`] takes (below that
/// a thread's start costs more than its share of a pass).
const PER_THREAD_MIN: usize = 1 << 16;

/// [`radix_sort_pairs`] on up to `threads` threads: each pass splits the
/// keys into contiguous blocks, counts each block's digits, and scatters
/// each block into its own slices of the digits' output ranges (block by
/// block within a digit, so the sort stays stable). Same result as one
/// thread; per pass one more read of the keys (the blocks' counts).
pub fn radix_sort_pairs_on(
    mut keys: Vec<u64>,
    mut payload: Vec<u64>,
    threads: usize,
) -> (Vec<u64>, Vec<u64>) {
    let n = keys.len().min(payload.len());
    keys.truncate(n);
    payload.truncate(n);
    if n <= 1 {
        return (keys, payload);
    }
    let mut hist = vec![[0usize; BUCKETS]; DIGITS];
    for k in &keys {
        for (d, h) in hist.iter_mut().enumerate() {
            h[((k >> (8 * d)) & 0xFF) as usize] += 1;
        }
    }
    let threads = threads.min(n / PER_THREAD_MIN).max(1);
    let (mut k2, mut p2): (Vec<u64>, Vec<u64>) = (vec![0; n], vec![0; n]);
    for (d, h) in hist.iter().enumerate() {
        // A byte that is the same in every key moves nothing.
        if h.contains(&n) {
            continue;
        }
        let shift = 8 * d;
        if threads == 1 {
            let mut next = [0usize; BUCKETS];
            let mut sum = 0;
            for (b, c) in h.iter().enumerate() {
                next[b] = sum;
                sum += c;
            }
            for (k, p) in keys.iter().zip(&payload) {
                let b = ((k >> shift) & 0xFF) as usize;
                let at = next[b];
                next[b] += 1;
                k2[at] = *k;
                p2[at] = *p;
            }
        } else {
            scatter_blocks(&keys, &payload, &mut k2, &mut p2, shift, threads);
        }
        std::mem::swap(&mut keys, &mut k2);
        std::mem::swap(&mut payload, &mut p2);
    }
    (keys, payload)
}

/// One pass of [`radix_sort_pairs_on`] on `threads` blocks: the output of
/// digit b is block 0's b-keys, then block 1's, and so on, each block
/// writing only its own slices.
fn scatter_blocks(
    keys: &[u64],
    payload: &[u64],
    k2: &mut [u64],
    p2: &mut [u64],
    shift: usize,
    threads: usize,
) {
    let n = keys.len();
    let per = n.div_ceil(threads);
    let digit = |k: &u64| ((k >> shift) & 0xFF) as usize;
    let counts: Vec<[usize; BUCKETS]> = map_scoped(keys.chunks(per).collect(), threads, |block| {
        let mut c = [0usize; BUCKETS];
        for k in block {
            c[digit(k)] += 1;
        }
        c
    });
    // Slices of the outputs, digit-major then block: block t gets, for
    // each digit, the slice its keys of that digit go to.
    let blocks = counts.len();
    let mut kout: Vec<Vec<&mut [u64]>> = (0..blocks).map(|_| Vec::with_capacity(BUCKETS)).collect();
    let mut pout: Vec<Vec<&mut [u64]>> = (0..blocks).map(|_| Vec::with_capacity(BUCKETS)).collect();
    let (mut krest, mut prest) = (k2, p2);
    for b in 0..BUCKETS {
        for (c, (ko, po)) in counts.iter().zip(kout.iter_mut().zip(pout.iter_mut())) {
            let (kh, kt) = std::mem::take(&mut krest).split_at_mut(c[b]);
            let (ph, pt) = std::mem::take(&mut prest).split_at_mut(c[b]);
            ko.push(kh);
            po.push(ph);
            krest = kt;
            prest = pt;
        }
    }
    let work: Vec<_> = keys
        .chunks(per)
        .zip(payload.chunks(per))
        .zip(kout.into_iter().zip(pout))
        .collect();
    map_scoped(work, threads, |((kb, pb), (mut ko, mut po))| {
        let mut at = [0usize; BUCKETS];
        for (k, p) in kb.iter().zip(pb) {
            let b = digit(k);
            ko[b][at[b]] = *k;
            po[b][at[b]] = *p;
            at[b] += 1;
        }
    });
}

/// Rows ahead of the current one whose value the gather asks the cache
/// for: a sorted order reads its sources at random, so each read misses;
/// asking early keeps about this many misses in flight instead of one.
const PREFETCH_AHEAD: usize = 16;

/// The row of `parts` that a packed index names: part in the high 32
/// bits, row in the low 32.
pub fn unpack_row(r: u64) -> (usize, usize) {
    ((r >> 32) as usize, (r & 0xFFFF_FFFF) as usize)
}

/// Appends `parts[b][i]` to `out` for each packed `(b, i)` of `rows`
/// ([`unpack_row`]), prefetching a few rows ahead. Returns false (with
/// `out` holding the rows before it) at the first index outside `parts`.
///
/// Cost: one random read per row, overlapped with the next
/// `PREFETCH_AHEAD` rows' reads.
pub fn gather_packed<T: Copy>(parts: &[&[T]], rows: &[u64], out: &mut Vec<T>) -> bool {
    out.reserve(rows.len());
    for (j, r) in rows.iter().enumerate() {
        if let Some(ahead) = rows.get(j + PREFETCH_AHEAD) {
            let (b, i) = unpack_row(*ahead);
            if let Some(x) = parts.get(b).and_then(|p| p.get(i)) {
                prefetch(x);
            }
        }
        let (b, i) = unpack_row(*r);
        match parts.get(b).and_then(|p| p.get(i)) {
            Some(x) => out.push(*x),
            None => return false,
        }
    }
    true
}

/// Asks the cache for the line holding `x` (a hint: no effect on results).
#[inline(always)]
fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing into the program and cannot fault;
    // `x` is a live reference anyway. SSE is part of every x86_64 target.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (x as *const T).cast::<i8>(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn next(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// Against a stable comparison sort, on fresh random keys of several
    /// spreads (constant bytes skipped or not), element by element.
    #[test]
    fn matches_a_stable_comparison_sort() {
        let mut s = 0x1234_5678_9ABC_DEF1u64;
        // 300_001 and 1 << 19 take the threads (at least PER_THREAD_MIN keys
        // a thread), with blocks of unequal length.
        for n in [
            0usize,
            1,
            2,
            3,
            255,
            256,
            257,
            1000,
            65_537,
            300_001,
            1 << 19,
        ] {
            for spread in [0u32, 1, 8, 17, 40, 64] {
                let keys: Vec<u64> = (0..n)
                    .map(|_| {
                        let x = next(&mut s);
                        if spread == 64 {
                            x
                        } else {
                            (x & ((1u64 << spread) - 1)) + 0xABCD_0000_0000_0000
                        }
                    })
                    .collect();
                let payload: Vec<u64> = (0..n as u64).map(|i| i * 3 + 1).collect();
                let mut want: Vec<(u64, u64)> =
                    keys.iter().copied().zip(payload.iter().copied()).collect();
                want.sort_by_key(|e| e.0); // stable
                let (k, p) = radix_sort_pairs(keys.clone(), payload.clone());
                let got: Vec<(u64, u64)> = k.into_iter().zip(p).collect();
                assert_eq!(got, want, "n = {n}, spread {spread}");
                for threads in [2, 3, 7] {
                    let (k, p) = radix_sort_pairs_on(keys.clone(), payload.clone(), threads);
                    let got: Vec<(u64, u64)> = k.into_iter().zip(p).collect();
                    assert_eq!(got, want, "n = {n}, spread {spread}, {threads} threads");
                }
            }
        }
    }

    /// Every packed index lands on its part's row; an index outside the
    /// parts stops the gather instead of panicking.
    #[test]
    fn gather_packed_follows_the_indices() {
        let mut s = 99u64;
        let parts: Vec<Vec<u32>> = (0..5)
            .map(|b| (0..b * 37 + 3).map(|i| b * 100_000 + i).collect())
            .collect();
        let refs: Vec<&[u32]> = parts.iter().map(|p| p.as_slice()).collect();
        let rows: Vec<u64> = (0..10_000)
            .map(|_| {
                let b = next(&mut s) % 5;
                let i = next(&mut s) % parts[b as usize].len() as u64;
                b << 32 | i
            })
            .collect();
        let mut out = Vec::new();
        assert!(gather_packed(&refs, &rows, &mut out));
        for (r, got) in rows.iter().zip(&out) {
            let (b, i) = unpack_row(*r);
            assert_eq!(*got, b as u32 * 100_000 + i as u32);
        }
        let mut out = Vec::new();
        assert!(!gather_packed(&refs, &[1, 7 << 32], &mut out));
        assert_eq!(out, vec![1]);
    }

    #[test]
    fn order_key_keeps_signed_order() {
        let xs = [i64::MIN, -5, -1, 0, 1, 7, i64::MAX];
        for w in xs.windows(2) {
            assert!(order_key(w[0]) < order_key(w[1]), "{w:?}");
        }
    }
}
