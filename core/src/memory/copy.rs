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
//! `cores_per_rank` threads (`BRAID_COPY_THREADS` caps it; 1 turns the
//! split off). Two in-process ranks on a 2-core host have one
//! core each: nothing is split there.

use std::sync::OnceLock;

/// Bytes below which a share is not worth a thread of its own.
pub const PER_THREAD: usize = 256 << 10;

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

/// Threads a fill of `bytes` uses: shares of at least [`PER_THREAD`],
/// at most this rank's share of the cores (or `BRAID_COPY_THREADS`).
pub fn fill_threads(bytes: usize) -> usize {
    let cap = threads_override().unwrap_or_else(crate::context::cores_per_rank);
    cap.min(bytes / PER_THREAD).max(1)
}

fn threads_override() -> Option<usize> {
    static OVERRIDE: OnceLock<Option<usize>> = OnceLock::new();
    *OVERRIDE.get_or_init(|| {
        let v = std::env::var("BRAID_COPY_THREADS").ok()?;
        match v.parse::<usize>() {
            Ok(n) if n >= 1 => Some(n),
            _ => {
                tracing::warn!("BRAID_COPY_THREADS={v:?} ignored: expected a count of at least 1");
                None
            }
        }
    })
}

/// Performs `moves` into the memory at `base`, on [`fill_threads`]
/// threads (the caller's among them) when they are large.
///
/// # Safety
///
/// Every move's destination `[at, at + len)` lies inside one allocation
/// that starts at `base`; no two destinations overlap; every `src` is
/// readable for its `len` bytes and overlaps no destination; nothing else
/// reads or writes the destinations, or writes the sources, during the
/// call.
pub(crate) unsafe fn fill(base: *mut u8, moves: &[Move]) {
    let total: usize = moves.iter().map(|m| m.len).sum();
    // SAFETY: the caller's contract.
    unsafe { fill_on(base, moves, fill_threads(total)) }
}

/// [`fill`] on `threads` threads.
///
/// # Safety
///
/// [`fill`]'s contract.
unsafe fn fill_on(base: *mut u8, moves: &[Move], threads: usize) {
    let total: usize = moves.iter().map(|m| m.len).sum();
    if threads <= 1 {
        // SAFETY: the caller's contract.
        unsafe { run(Base(base), moves) };
        return;
    }
    let shares = split(moves, total, threads);
    let base = Base(base);
    // SAFETY: the shares cut the moves into disjoint pieces (the caller's
    // contract holds for each), and `for_each_share` returns only once
    // every share has run.
    crate::par::for_each_share(threads, &|k| unsafe { run(base, &shares[k]) });
}

/// The moves one thread performs, in order.
///
/// # Safety
///
/// `fill`'s contract, for these moves.
unsafe fn run(base: Base, moves: &[Move]) {
    for m in moves {
        // SAFETY: `fill`'s contract: the destination lies in the
        // allocation, the source is readable and overlaps no destination.
        unsafe {
            let dst = base.0.add(m.at);
            match m.src {
                Some(src) => std::ptr::copy_nonoverlapping(src, dst, m.len),
                None => std::ptr::write_bytes(dst, 0, m.len),
            }
        }
    }
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
        for threads in [1, 2, 3, 8] {
            dst.fill(0xAA);
            // SAFETY: destinations inside `dst`, disjoint; sources are `src`.
            unsafe { fill_on(dst.as_mut_ptr(), &moves, threads) };
            assert_eq!(&dst[..half], &src[..half]);
            assert!(dst[half..half + 1000].iter().all(|&b| b == 0));
            assert_eq!(&dst[half + 1000..], &src[half..]);
        }
        // Below one share's worth, one thread.
        assert!(fill_threads(len) >= 1);
        assert_eq!(fill_threads(PER_THREAD - 1), 1);
    }
}
