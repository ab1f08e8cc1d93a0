//! Filling a result vector: the copies (and zeroed gaps) that put a
//! collective's parts into one vector, spread over the cores this rank may
//! use when they are large.
//!
//! A one-vector result (AllToAll into one vector, an AllReduce's reduced
//! blocks, an AllGather's concatenation) is one copy of every byte that
//! did not land in place. MPI makes that copy on the one thread of each
//! process. A rank of braid that has cores of its own (ranks on a host
//! share its cores evenly: `cores_per_rank`) can split it:
//!
//! ```text
//!   moves:   [part 0 ......][gap][part 2 ..........................]
//!   threads: |--- thread 0 ---|--- thread 1 ---|--- thread 2 ---|
//!            (equal byte shares, cut across moves; the caller is thread 0)
//! ```
//!
//! Cost model: one thread copies at memory speed for its core (~10-20 GB/s
//! on current x86), a host's memory serves several times that, and handing
//! a share to a helper (`crate::par`) costs ~1 us while helpers spin, tens
//! of us when one must be woken (a share nobody took is taken back by the
//! caller). So a copy is split only into shares of at least
//! [`PER_THREAD`] bytes (~15-25 us of copying each), over at most
//! `cores_per_rank` threads (`BRAID_COPY_THREADS` sets the cap instead; 1
//! turns the split off), and over three quarters of them where the shares
//! on all of them would be below [`FULL_SHARE`]: where the fills of every
//! rank on the host together take all its cores, each fill waits for its
//! slowest share, and any other thread of the host (a rank's runtime
//! worker, the system) holds one of them back, which costs less than the
//! last cores gain only where each share copies for a while. Two
//! in-process ranks on a 2-core host have one core each: nothing is split
//! there.
//!
//! Measured (2026-11-30, 16-core host, in-process ranks, `braid-bench
//! coll`, `BRAID_COPY_THREADS` 1 to 8 with the cap then at 8 for 2 ranks
//! and 4 for 4; us per call, two rounds): 2 ranks filling 2 MiB (an
//! AllGather of 1 MiB) 151-219 on 1 thread, 67-75 on 3, 51-60 on 4 to 6,
//! 82-114 on 8; filling 4 MiB (AllToAllv of 4 MiB) 101-128 on 4 or 5,
//! 83-117 on 6, 175-202 on 8; filling 8 MiB 145-208 on 6, 176-214 on 8,
//! 261-306 on 4; filling 32 MiB (AllGather of 16 MiB) 553-757 on 8,
//! 833-860 on 6; 4 ranks filling 1 MiB (AllToAll of 1 MiB) 61-64 on 3,
//! 95-102 on 4; filling 4 MiB 175-183 on 3, 207-222 on 4.
//!
//! Stores: a fill whose bytes cannot stay in the last-level cache writes
//! with streaming (non-temporal) stores ([`Stores`]). A cached store first
//! reads the destination's line (for ownership) and evicts lines the
//! other copies still read, so a copy larger than the cache moves three
//! bytes through memory per byte copied; a streaming store moves two.
//! Measured (2026-11-29, 2-core VM, AMD EPYC, 32 MiB L3; 16 MiB copied
//! again and again on each of 2 threads): 7-10 GB/s a thread with
//! `memcpy`, 11-16 with streaming stores; 4 MiB each (within the cache):
//! 30-45 against 15-18, so the choice is made by size: see
//! [`stores_for`].

use std::sync::OnceLock;

/// Bytes below which a share is not worth a thread of its own.
pub const PER_THREAD: usize = 256 << 10;

/// Bytes a share must reach on every one of the rank's cores for a fill
/// to take them all (below, it takes three quarters: see the module's
/// cost model).
pub const FULL_SHARE: usize = 2 << 20;

/// One piece of a fill: `len` bytes at byte `at` of the destination,
/// copied from `src`, or zeroed where `src` is `None`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Move {
    pub at: usize,
    pub src: Option<*const u8>,
    pub len: usize,
}

// SAFETY: a `Move` is only dereferenced by `fill`, under the contract its
// caller promised (sources readable and not written by anyone during the
// fill, destinations disjoint); the pointers themselves may travel.
unsafe impl Send for Move {}
// SAFETY: as for `Send`: shared `Move`s are read-only descriptions.
unsafe impl Sync for Move {}

/// The destination's first byte, handed to the fill's threads.
#[derive(Clone, Copy)]
struct Base(*mut u8);

// SAFETY: the threads write disjoint byte ranges of the destination (the
// shares of `split`), and the caller waits for all of them (`par`
// threads) before it reads or frees the destination.
unsafe impl Send for Base {}
// SAFETY: see `Send`.
unsafe impl Sync for Base {}

/// Threads a fill of `bytes` uses: shares of at least `PER_THREAD` (256 KiB),
/// on at most this rank's share of the cores (or `BRAID_COPY_THREADS`),
/// three quarters of them unless each would copy `FULL_SHARE` or more:
/// see the module's cost model.
pub fn fill_threads(bytes: usize) -> usize {
    match threads_override() {
        Some(cap) => cap.min(bytes / PER_THREAD).max(1),
        None => fill_threads_on(bytes, crate::context::cores_per_rank()),
    }
}

/// [`fill_threads`] for a rank with `cores` cores and no override.
fn fill_threads_on(bytes: usize, cores: usize) -> usize {
    let cap = if bytes / cores.max(1) >= FULL_SHARE {
        cores
    } else {
        cores - cores / 4
    };
    cap.min(bytes / PER_THREAD).max(1)
}

fn threads_override() -> Option<usize> {
    static OVERRIDE: OnceLock<Option<usize>> = OnceLock::new();
    *OVERRIDE.get_or_init(|| crate::env::count("BRAID_COPY_THREADS", 1))
}

/// How a fill writes its copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stores {
    /// Through the cache (`memcpy`): the result is read soon, from the
    /// cache, and the copies fit in it.
    Cached,
    /// Streaming (non-temporal) stores, around the cache: for copies too
    /// large to stay in it (x86-64; elsewhere as `Cached`).
    Streaming,
}

/// Whether a fill's destination was written before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// Written before (a kept vector): its pages are in place.
    Written,
    /// Fresh from the allocator: a page not yet touched faults in at its
    /// first store and the kernel zeroes it through the cache, where a
    /// cached store then finds it; streaming stores to it lost
    /// (2026-11-29, 2-core VM, 2 ranks, AllToAllv of 64 MiB into fresh
    /// vectors: 10.6-11.7 ms cached, 12.5-14.5 streaming).
    Fresh,
}

/// How a fill of `bytes` writes: [`Stores::Streaming`] where the fills of
/// every rank on the host at once (each reading as much as it writes:
/// 2 x `bytes` x ranks on the host) come to 1.5 times the last-level
/// cache or more (between 1 and 2 times the 32 MiB cache of the
/// measurements in the module doc, cached stores won at 1 time and lost
/// at 2) and the destination was written before, else [`Stores::Cached`]
/// (also where the cache's size is not known). `BRAID_COPY_STORES=cached`
/// or `streaming` overrides this.
pub fn stores_for(bytes: usize, pages: Pages) -> Stores {
    if let Some(s) = stores_override() {
        return s;
    }
    if pages == Pages::Fresh {
        return Stores::Cached;
    }
    let Some(cache) = last_level_cache() else {
        return Stores::Cached;
    };
    let ranks = crate::context::ranks_on_host().max(1);
    let working = bytes.saturating_mul(2).saturating_mul(ranks);
    if working >= cache.saturating_add(cache / 2) {
        Stores::Streaming
    } else {
        Stores::Cached
    }
}

fn stores_override() -> Option<Stores> {
    static OVERRIDE: OnceLock<Option<Stores>> = OnceLock::new();
    *OVERRIDE.get_or_init(|| {
        crate::env::choice(
            "BRAID_COPY_STORES",
            &[("cached", Stores::Cached), ("streaming", Stores::Streaming)],
        )
    })
}

/// The last-level cache's size in bytes, as Linux reports it for CPU 0
/// (the highest cache index of type Data or Unified), asked once.
fn last_level_cache() -> Option<usize> {
    static SIZE: OnceLock<Option<usize>> = OnceLock::new();
    *SIZE.get_or_init(|| {
        let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
        (0..8)
            .rev()
            .filter_map(|i| {
                let idx = dir.join(format!("index{i}"));
                let kind = std::fs::read_to_string(idx.join("type")).ok()?;
                if kind.trim() == "Instruction" {
                    return None;
                }
                parse_cache_size(&std::fs::read_to_string(idx.join("size")).ok()?)
            })
            .next()
    })
}

/// A cache size as sysfs writes it (`32768K`, `1M`, `512`).
fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let n: usize = num.parse().ok()?;
    let unit = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(unit)
}

/// Performs `moves` into the memory at `base`, on [`fill_threads`]
/// threads (the caller's among them) when they are large, with the stores
/// [`stores_for`] says for a destination of `pages`.
///
/// # Safety
///
/// Every move's destination `[at, at + len)` lies inside one allocation
/// that starts at `base`; no two destinations overlap; every `src` is
/// readable for its `len` bytes and overlaps no destination; nothing else
/// reads or writes the destinations, or writes the sources, during the
/// call.
pub(crate) unsafe fn fill(base: *mut u8, moves: &[Move], pages: Pages) {
    let total: usize = moves.iter().map(|m| m.len).sum();
    // SAFETY: the caller's contract.
    unsafe { fill_on(base, moves, fill_threads(total), stores_for(total, pages)) }
}

/// [`fill`] on `threads` threads with `stores`.
///
/// # Safety
///
/// [`fill`]'s contract.
unsafe fn fill_on(base: *mut u8, moves: &[Move], threads: usize, stores: Stores) {
    let total: usize = moves.iter().map(|m| m.len).sum();
    if threads <= 1 {
        // SAFETY: the caller's contract.
        unsafe { run(Base(base), moves, stores) };
        return;
    }
    let shares = split(moves, total, threads);
    let base = Base(base);
    // SAFETY: the shares cut the moves into disjoint pieces (the caller's
    // contract holds for each), and `for_each_share` returns only once
    // every share has run.
    crate::par::for_each_share(threads, &|k| unsafe { run(base, &shares[k], stores) });
}

/// The moves one thread performs, in order.
///
/// # Safety
///
/// `fill`'s contract, for these moves.
unsafe fn run(base: Base, moves: &[Move], stores: Stores) {
    for m in moves {
        // SAFETY: `fill`'s contract: the destination lies in the
        // allocation, the source is readable and overlaps no destination.
        unsafe {
            let dst = base.0.add(m.at);
            match (m.src, stores) {
                (Some(src), Stores::Streaming) => stream_copy(dst, src, m.len),
                (Some(src), Stores::Cached) => std::ptr::copy_nonoverlapping(src, dst, m.len),
                (None, _) => std::ptr::write_bytes(dst, 0, m.len),
            }
        }
    }
}

/// Copies `len` bytes from `src` to `dst` with streaming stores, then
/// fences them (they are not ordered with later stores otherwise: the
/// release that tells another thread the copy is done would not cover
/// them).
///
/// # Safety
///
/// As `std::ptr::copy_nonoverlapping`.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // The head up to the destination's first 16-byte boundary, and the
    // tail after its last, are copied plainly.
    let head = dst.align_offset(16).min(len);
    // SAFETY: the caller's contract; SSE2 is part of x86-64.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, head);
        let mut i = head;
        while i + 64 <= len {
            let a = _mm_loadu_si128(src.add(i) as *const __m128i);
            let b = _mm_loadu_si128(src.add(i + 16) as *const __m128i);
            let c = _mm_loadu_si128(src.add(i + 32) as *const __m128i);
            let d = _mm_loadu_si128(src.add(i + 48) as *const __m128i);
            _mm_stream_si128(dst.add(i) as *mut __m128i, a);
            _mm_stream_si128(dst.add(i + 16) as *mut __m128i, b);
            _mm_stream_si128(dst.add(i + 32) as *mut __m128i, c);
            _mm_stream_si128(dst.add(i + 48) as *mut __m128i, d);
            i += 64;
        }
        std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
        _mm_sfence();
    }
}

/// As `std::ptr::copy_nonoverlapping` where streaming stores are not
/// written for the architecture.
///
/// # Safety
///
/// As `std::ptr::copy_nonoverlapping`.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// `moves` (of `total` bytes) cut into `threads` shares of equal bytes
/// (the last takes the remainder), each a list of whole or cut moves in
/// the original order.
fn split(moves: &[Move], total: usize, threads: usize) -> Vec<Vec<Move>> {
    let per = total.div_ceil(threads).max(1);
    let mut shares: Vec<Vec<Move>> = vec![Vec::new(); threads];
    let mut k = 0;
    let mut room = per;
    for m in moves {
        let mut done = 0;
        while done < m.len {
            if room == 0 && k + 1 < threads {
                k += 1;
                room = per;
            }
            let n = if k + 1 < threads {
                (m.len - done).min(room)
            } else {
                m.len - done
            };
            shares[k].push(Move {
                at: m.at + done,
                src: m.src.map(|p| p.wrapping_add(done)),
                len: n,
            });
            done += n;
            room = room.saturating_sub(n);
        }
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each byte of the destination written exactly once, by the right
    /// move, for splits of every shape.
    #[test]
    fn split_covers_every_byte_once() {
        for threads in 1..=7 {
            for lens in [
                vec![0usize, 5, 0, 13, 1],
                vec![100],
                vec![1, 1, 1, 1, 1, 1, 1, 1, 1],
                vec![37, 0, 64, 3],
            ] {
                let mut at = 0;
                let moves: Vec<Move> = lens
                    .iter()
                    .enumerate()
                    .map(|(i, &len)| {
                        let m = Move {
                            at,
                            // A fake source: only its offsets are checked.
                            src: (i % 2 == 0).then(|| (1000 * (i + 1)) as *const u8),
                            len,
                        };
                        at += len;
                        m
                    })
                    .collect();
                let total = at;
                let shares = split(&moves, total, threads);
                assert_eq!(shares.len(), threads);
                let mut seen = vec![0u32; total];
                for s in &shares {
                    for m in s {
                        seen[m.at..m.at + m.len].iter_mut().for_each(|c| *c += 1);
                        // The piece's source is its move's, advanced.
                        let orig = moves.iter().find(|o| o.at <= m.at && m.at < o.at + o.len);
                        let orig = orig.copied().expect("a piece inside a move");
                        assert!(m.at + m.len <= orig.at + orig.len);
                        assert_eq!(
                            m.src.map(|p| p as usize),
                            orig.src.map(|p| p as usize + (m.at - orig.at))
                        );
                    }
                }
                assert!(
                    seen.iter().all(|&c| c == 1),
                    "threads {threads}, lens {lens:?}"
                );
                // Shares are balanced: none over its equal share, but the last.
                let per = total.div_ceil(threads).max(1);
                for s in &shares[..threads - 1] {
                    assert!(s.iter().map(|m| m.len).sum::<usize>() <= per);
                }
            }
        }
    }

    /// Streaming copies of every alignment of source and destination and
    /// every short length write exactly their bytes.
    #[test]
    fn streaming_copies_are_exact_at_any_alignment() {
        let src: Vec<u8> = (0..600).map(|i| (i * 31 + 7) as u8).collect();
        let mut dst = vec![0u8; 700];
        for s_off in 0..17 {
            for d_off in 0..17 {
                for len in [0, 1, 15, 16, 17, 63, 64, 65, 130, 511] {
                    dst.fill(0xAA);
                    // SAFETY: both ranges lie inside their vectors (at most
                    // 16 + 511 bytes of 600 and 700), which do not overlap.
                    unsafe {
                        stream_copy(dst.as_mut_ptr().add(d_off), src.as_ptr().add(s_off), len)
                    };
                    assert_eq!(&dst[d_off..d_off + len], &src[s_off..s_off + len]);
                    assert!(dst[..d_off].iter().all(|&b| b == 0xAA));
                    assert!(dst[d_off + len..].iter().all(|&b| b == 0xAA));
                }
            }
        }
    }

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("12X"), None);
        assert_eq!(parse_cache_size(""), None);
    }

    /// A fill over several threads writes what one thread would.
    #[test]
    fn fill_matches_a_plain_copy() {
        let src: Vec<u8> = (0..(3 * PER_THREAD + 12345))
            .map(|i| (i * 7 + 3) as u8)
            .collect();
        let len = src.len() + 1000;
        let mut dst = vec![0xAAu8; len];
        let half = src.len() / 2;
        let moves = [
            Move {
                at: 0,
                src: Some(src.as_ptr()),
                len: half,
            },
            Move {
                at: half,
                src: None,
                len: 1000,
            },
            Move {
                at: half + 1000,
                src: Some(src[half..].as_ptr()),
                len: src.len() - half,
            },
        ];
        for stores in [Stores::Cached, Stores::Streaming] {
            for threads in [1, 2, 3, 8] {
                dst.fill(0xAA);
                // SAFETY: destinations inside `dst`, disjoint; sources are
                // `src`.
                unsafe { fill_on(dst.as_mut_ptr(), &moves, threads, stores) };
                assert_eq!(&dst[..half], &src[..half]);
                assert!(dst[half..half + 1000].iter().all(|&b| b == 0));
                assert_eq!(&dst[half + 1000..], &src[half..]);
            }
        }
        // Below one share's worth, one thread; above, a share of 256 KiB
        // or more a thread, on three quarters of the rank's cores.
        assert!(fill_threads(len) >= 1);
        assert_eq!(fill_threads(PER_THREAD - 1), 1);
        for (bytes, cores, want) in [
            (1 << 20, 1, 1),
            (1 << 20, 2, 2),
            (1 << 20, 4, 3),
            (1 << 20, 8, 4),
            (2 << 20, 8, 6),
            (8 << 20, 8, 6),
            (16 << 20, 8, 8),
            (4 << 20, 4, 3),
            (8 << 20, 4, 4),
            (64 << 20, 16, 16),
            (usize::MAX, 0, 1),
        ] {
            assert_eq!(
                fill_threads_on(bytes, cores),
                want,
                "{bytes} bytes, {cores} cores"
            );
        }
    }
}
