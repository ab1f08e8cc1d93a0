//! How a rank spreads its CPU-heavy steps (Parquet decoding and encoding,
//! the local sort's radix sort and gather, the rolling kernel's chunks)
//! over threads.
//!
//! A rank's graph runs as tokio tasks; a step that is CPU work runs in
//! blocking tasks, and splits its work over up to [`rank_threads`] of
//! them: scoped threads ([`map_scoped`]) or, for the Parquet source, that
//! many pieces decoded at once. The count is the host's cores shared among
//! the host's ranks, so ranks that fill the cores keep one thread each (as
//! before), while one or two ranks on a many-core host use the rest.
//!
//! The count is per step, not a budget a rank's steps share: steps that
//! overlap (the kernel's chunks while the sink encodes) may together run
//! about twice as many threads as the rank's share for a while, which costs
//! some time slicing but never blocks. The ranks on a host are counted as
//! `braid_core::Waiting` counts them (this process's contexts, or what the
//! launcher says); ranks started by hand on one host should set
//! `BRAID_HOST_RANKS` (or `BRAID_RANK_THREADS`), or each takes every core.

use std::sync::{Arc, Mutex};

/// The variable that sets [`rank_threads`] for a whole process.
pub const RANK_THREADS_ENV: &str = "BRAID_RANK_THREADS";

/// Threads a rank's CPU-heavy steps use: the host's cores shared among its
/// ranks ([`braid_core::context::cores_per_rank`]), or `BRAID_RANK_THREADS`
/// where set to a number of at least 1.
pub fn rank_threads() -> usize {
    std::env::var(RANK_THREADS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&t| t >= 1)
        .unwrap_or_else(braid_core::context::cores_per_rank)
}

/// `f` over `items` on up to `threads` scoped threads (contiguous shares,
/// the caller's thread taking the first, and any share whose thread the OS
/// refuses), results in `items`' order. A panic in `f` goes on in the
/// caller, as it would on one thread.
pub fn map_scoped<T: Send, R: Send>(
    items: Vec<T>,
    threads: usize,
    f: impl Fn(T) -> R + Sync,
) -> Vec<R> {
    let threads = threads.min(items.len()).max(1);
    if threads == 1 {
        return items.into_iter().map(f).collect();
    }
    let per = items.len().div_ceil(threads);
    let mut shares: Vec<Vec<T>> = Vec::with_capacity(threads);
    let mut it = items.into_iter().peekable();
    while it.peek().is_some() {
        shares.push(it.by_ref().take(per).collect());
    }
    let f = &f;
    std::thread::scope(|s| {
        let mut rest = shares.into_iter();
        let first = rest.next().unwrap_or_default();
        // A share whose thread the OS refuses runs on the caller's thread,
        // after the first share.
        let mut inline = Vec::new();
        let mut handles = Vec::new();
        for (k, share) in rest.enumerate() {
            // The share stays reachable here if the spawn fails.
            let slot = Arc::new(Mutex::new(Some(share)));
            let spawned = std::thread::Builder::new().spawn_scoped(s, {
                let slot = Arc::clone(&slot);
                move || -> Vec<R> {
                    let share = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                    share.unwrap_or_default().into_iter().map(f).collect()
                }
            });
            match spawned {
                Ok(h) => handles.push((k, h)),
                Err(_) => {
                    let share = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                    inline.push((k, share.unwrap_or_default()));
                }
            }
        }
        let mut parts: Vec<(usize, Vec<R>)> = Vec::with_capacity(threads);
        parts.push((0, first.into_iter().map(f).collect()));
        for (k, share) in inline {
            parts.push((k + 1, share.into_iter().map(f).collect()));
        }
        for (k, h) in handles {
            match h.join() {
                Ok(v) => parts.push((k + 1, v)),
                Err(p) => std::panic::resume_unwind(p),
            }
        }
        parts.sort_by_key(|(k, _)| *k);
        parts.into_iter().flat_map(|(_, v)| v).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_scoped_keeps_order_for_any_thread_count() {
        for n in [0usize, 1, 2, 7, 64] {
            let items: Vec<usize> = (0..n).collect();
            let want: Vec<usize> = items.iter().map(|x| x * x + 1).collect();
            for t in [1, 2, 3, 8, 100] {
                let got = map_scoped(items.clone(), t, |x| x * x + 1);
                assert_eq!(got, want, "{n} items, {t} threads");
            }
        }
    }

    #[test]
    fn map_scoped_uses_other_threads() {
        let main = std::thread::current().id();
        let ids = map_scoped((0..4).collect(), 4, |_| std::thread::current().id());
        assert_eq!(ids[0], main);
        assert!(ids[1..].iter().all(|id| *id != main));
    }
}
